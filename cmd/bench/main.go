// Command bench measures Sluice's distributed token bucket (package
// bucket) and semaphore (package semaphore) on Redis, compares the bucket
// with other limiters, and prints a report; `bench chaos` runs the chaos
// soak instead. `go run ./cmd/bench --help` lists the scenarios and their
// flags; docs/benchmarks.md defines every figure and records runs.
//
// Each scenario is one file: a type that implements scenario (scenario.go)
// and is listed in scenarios().
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

func main() {
	loadgen.MaybeWorker() // the worker processes of saturate, scale and chaos are this binary
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

// run parses args, runs the scenarios they pick and writes the report to
// stdout; progress goes to stderr. --help writes the usage to stdout and
// returns nil. With --check, a goal not met is an error, after the report.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	rep, com, err := measure(ctx, args, stdout, stderr)
	if err != nil || rep == nil {
		return err // rep is nil after --help
	}
	switch {
	case com.json:
		err = writeJSON(stdout, *rep)
	case com.gobench:
		err = writeGobench(stdout, *rep)
	default:
		err = writeTable(stdout, *rep)
	}
	if err != nil || !com.check {
		return err
	}
	return goalsMet(*rep)
}

// measure parses args and runs the scenarios they pick: run without the
// report. After --help, which it writes to stdout, the report is nil.
func measure(ctx context.Context, args []string, stdout, stderr io.Writer) (*Report, common, error) {
	list, chaos := scenarios(), false
	if len(args) > 0 && args[0] == "chaos" {
		list, chaos, args = []scenario{&Chaos{}}, true, args[1:]
	}
	com, picked, err := parse(args, list, chaos, stdout)
	if err != nil || picked == nil {
		return nil, com, err // picked is nil after --help
	}
	rep := Report{Machine: machine(), Limit: limitOf(com.limit)}
	tg, closeServer, err := connect(com.redisURL, stderr, &rep.Redis)
	if err != nil {
		return nil, com, err
	}
	defer closeServer()
	probe := client(tg.opt, 1)
	rep.Redis.Version = redisVersion(ctx, probe)
	if rep.Redis.Fake {
		rep.Redis.Version = "miniredis " + miniredisVersion() // its INFO has no redis_version
	}
	probe.Close()

	name := fmt.Sprintf("bench-%d-%d", os.Getpid(), time.Now().UnixNano())
	for _, s := range picked {
		a := s.about()
		if rep.Redis.Fake && a.needs != "" {
			fmt.Fprintf(stderr, "%s: skipped on miniredis: %s\n", a.name, a.needs)
			rep.Skipped = append(rep.Skipped, Skipped{Scenario: a.name, Why: a.needs})
			continue
		}
		e := &env{target: tg, limit: com.limit, name: name + "-" + a.name, log: stderr}
		if err := s.run(ctx, e); err != nil {
			return nil, com, fmt.Errorf("%s: %w", a.name, err)
		}
		rep.Scenarios = append(rep.Scenarios, s)
	}
	return &rep, com, nil
}

// goalsMet returns an error naming every goal the report says was not
// met, or nil: --check's verdict, given after the report.
func goalsMet(rep Report) error {
	missed := missedGoals(rep)
	switch len(missed) {
	case 0:
		return nil
	case 1:
		return fmt.Errorf("1 goal not met: %s", missed[0])
	}
	return fmt.Errorf("%d goals not met: %s", len(missed), strings.Join(missed, "; "))
}

// common are the flags of every run.
type common struct {
	redisURL      string
	json, gobench bool
	// check makes a goal not met an error (a non-zero exit), after the
	// report is written.
	check bool
	limit bucket.Config
}

func (c *common) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.redisURL, "redis", "", "redis:// or rediss:// `URL` of an existing server (default: start a throwaway redis-server)")
	fs.BoolVar(&c.json, "json", false, "print the figures as JSON instead of the table")
	fs.BoolVar(&c.gobench, "gobench", false, "print the figures as Go benchmark lines (for benchstat) instead of the table")
	fs.BoolVar(&c.check, "check", false, "after the report, exit non-zero when a goal was not met, naming the goals")
	fs.IntVar(&c.limit.Capacity, "capacity", 50, "the limited bucket's capacity: the largest burst")
	fs.IntVar(&c.limit.RefillAmount, "refill-amount", 1, "the limited bucket's tokens added per refill")
	fs.DurationVar(&c.limit.RefillFrequency, "refill-frequency", 2*time.Millisecond, "the limited bucket's time between refills")
}

func (c *common) validate() error {
	l := c.limit
	switch {
	case c.json && c.gobench:
		return errors.New("--json and --gobench are exclusive")
	case l.Capacity < 1:
		return fmt.Errorf("--capacity %d: want ≥ 1", l.Capacity)
	case l.RefillAmount < 1 || l.RefillAmount > l.Capacity:
		return fmt.Errorf("--refill-amount %d: want between 1 and --capacity (%d)", l.RefillAmount, l.Capacity)
	case l.RefillFrequency < time.Microsecond || l.RefillFrequency%time.Microsecond != 0:
		return fmt.Errorf("--refill-frequency %v: want a whole number of microseconds, ≥ 1µs", l.RefillFrequency)
	}
	return nil
}

// parse reads args into the common flags and the flags of every scenario
// of list, and returns the scenarios to run: those --scenario names (the
// one of list for chaos). A flag of a scenario left out is an error, not
// silently ignored. On --help it writes the usage to stdout and returns no
// scenario.
func parse(args []string, list []scenario, chaos bool, stdout io.Writer) (common, []scenario, error) {
	var com common
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(io.Discard) // errors are returned; the usage is for --help
	sets := []*flag.FlagSet{flag.NewFlagSet("", flag.ContinueOnError)}
	com.flags(sets[0])
	pick := "all"
	if !chaos {
		sets[0].StringVar(&pick, "scenario", "all", "comma-separated `NAMES` of the scenarios to run, or all")
	}
	owner := map[string]scenario{}
	for _, s := range list {
		set := flag.NewFlagSet(s.about().name, flag.ContinueOnError)
		s.flags(set)
		set.VisitAll(func(f *flag.Flag) { owner[f.Name] = s })
		sets = append(sets, set)
	}
	for _, set := range sets {
		set.VisitAll(func(f *flag.Flag) { fs.Var(f.Value, f.Name, f.Usage) })
	}
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return com, nil, usage(stdout, list, chaos, sets)
	case err != nil:
		return com, nil, fmt.Errorf("%w (bench --help lists the flags)", err)
	case fs.NArg() > 0:
		return com, nil, fmt.Errorf("unexpected arguments %q (bench --help lists the flags)", fs.Args())
	}
	picked := list
	if !chaos {
		names := strings.Split(strings.ReplaceAll(pick, " ", ""), ",")
		for _, name := range names {
			if name != "all" && !slices.ContainsFunc(list, func(s scenario) bool { return s.about().name == name }) {
				return com, nil, fmt.Errorf("--scenario %q: no scenario %q (bench --help lists them)", pick, name)
			}
		}
		// In the list's order, whatever the order asked.
		picked = slices.DeleteFunc(slices.Clone(list), func(s scenario) bool {
			return !slices.Contains(names, s.about().name) && !(s.about().all && slices.Contains(names, "all"))
		})
	}
	var unused error
	fs.Visit(func(f *flag.Flag) {
		if s, ok := owner[f.Name]; ok && !slices.Contains(picked, s) && unused == nil {
			unused = fmt.Errorf("--%s is a flag of the %s scenario, which --scenario %s leaves out", f.Name, s.about().name, pick)
		}
	})
	if unused != nil {
		return com, nil, unused
	}
	if err := com.validate(); err != nil {
		return com, nil, err
	}
	for _, s := range picked {
		if err := s.check(); err != nil {
			return com, nil, err
		}
	}
	return com, picked, nil
}

// usage writes --help: what the command does, its scenarios and its flags.
func usage(w io.Writer, list []scenario, chaos bool, sets []*flag.FlagSet) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	if chaos {
		fmt.Fprint(tw, "Usage: go run ./cmd/bench chaos [flags]\n\n"+
			"The chaos soak: saturated callers in worker processes while, at random, processes\n"+
			"and redis-server are killed, stopped and restarted, links are delayed and cut, and\n"+
			"bursts of callers are cancelled. Then every grant is judged: never over the limit\n"+
			"between Redis restarts, no hang, no lost caller; a fault log shows each recovery.\n"+
			"It runs for --duration plus about 5 s, and starts a throwaway redis-server on a\n"+
			"free loopback port, which it kills, pauses and restarts (a server given with\n"+
			"--redis is never touched), worker processes of this same program, and a fault\n"+
			"proxy in front of half of them; all stop before it exits.\n")
	} else {
		fmt.Fprint(tw, "Usage: go run ./cmd/bench [flags]          run the scenarios (default: all)\n"+
			"       go run ./cmd/bench chaos [flags]    run the chaos soak instead (chaos --help)\n\n"+
			"Measures Sluice's distributed token bucket and semaphore on Redis, compares the\n"+
			"bucket with other limiters, and prints a report; docs/benchmarks.md defines\n"+
			"every figure. Unless --redis names a server, it starts a throwaway redis-server\n"+
			"on a free loopback port; without redis-server on PATH it runs on an in-process\n"+
			"miniredis (its figures are not representative) and skips the scenarios marked\n"+
			"\"needs redis-server\", saying why. Most scenarios also start worker processes of\n"+
			"this same program. Everything it starts stops before it exits.\n\nScenarios (--scenario NAME,NAME or all):\n")
		var all []string
		for _, s := range list {
			a := s.about()
			in := ""
			if a.all {
				in, all = "in all", append(all, a.name)
			}
			what := a.what
			if a.needs != "" {
				what += " (needs redis-server)"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\n", a.name, a.takes, in, what)
		}
		fmt.Fprintf(tw, "  all = %s: about %s\n", strings.Join(all, ","), allTakes)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprint(w, legend)
	for i, set := range sets {
		switch n := 0; {
		case i == 0:
			fmt.Fprintln(w, "\nFlags:")
		case !chaos:
			if set.VisitAll(func(*flag.Flag) { n++ }); n > 0 {
				fmt.Fprintf(w, "\nFlags of %s:\n", set.Name())
			}
		}
		set.SetOutput(w)
		set.PrintDefaults()
	}
	return nil
}

// allTakes is how long --scenario all runs with the default flags, on a
// 2-CPU machine.
const allTakes = "3 min"

// legend explains the report's words that a row cannot say in short.
const legend = `
Words in the report:
  grant time      the instant, on Redis's clock, at which the bucket gave a caller its
                  token (its "slot"); Enter returns then, in the caller's process.
  start time      when Enter returned in the caller's process, by the machine's clock.
  lateness        how long after its grant time Enter returned.
  utilization     grants after the initial burst (a full bucket's capacity) divided by
                  what the limit allows from the first grant time to the last: 100 %
                  means every refill was used.
  busiest window  of all windows of time, the one with the most grants compared with
                  what the limit allows in a window that long (capacity + the refills in
                  it). "3 below the limit" is 3 fewer, "exactly the limit" is all of it,
                  "1 OVER the limit" one more. The excess is how many over: 0 means the
                  limit held.
  start times, windows N longer
                  the bucket's promise for start times. A caller may start up to
                  MaxLateness (25 ms by default) after its grant time, plus the reply's
                  trip (2 ms allowed), so start times are judged in windows that much
                  longer. Grant times are held to the limit itself.
  retime          a caller that comes later than MaxLateness after its grant time (its
                  process was frozen or starved of CPU) does not start then: it takes the
                  next grant time, ahead of the callers queued. Its missed token goes
                  back to the bucket (a refund) when that provably keeps the limit; else
                  it stays spent.
  re-entry        a caller that lost its grant time (e.g. Redis restarted) or met a
                  change of the policies (SetPolicies) while queued queues again, at
                  the back.
  poll            a queued caller asking Redis for its grant time.
  scheduler step  one round in which a process assigns grant times to the callers at the
                  head of the queue; one process at a time holds the scheduler's lock, and
                  a step refused because another took it is "fenced".
  overtaken       a caller granted (or started) after one that reached Redis after it
                  (callers that missed their grant time and were retimed are left out).
  steady state    Enters begun after the warm-up, once every caller has been through
                  the queue once.
  goal ...: NOT MET
                  a figure missed its goal; --check then exits non-zero, naming them.
`

// target says where the callers connect.
type target struct {
	opt *redis.Options
	url string // --redis, passed on to worker processes; "" for a local server
	// srv is the throwaway redis-server this command started, nil for
	// --redis or miniredis: only it may be killed, paused and restarted.
	srv *redistest.Server
}

// client is a new client of opt with room for callers connections.
func client(opt *redis.Options, callers int) *redis.Client {
	o := *opt
	o.ContextTimeoutEnabled = true
	o.PoolSize = callers + 10
	return redis.NewClient(&o)
}

// startServer starts the throwaway redis-server; the tests of the
// miniredis fallback make it fail as without redis-server on PATH.
var startServer = func() (*redistest.Server, error) { return redistest.StartService() }

// connect returns where to connect: the server at url, or a throwaway
// redis-server, or as a last resort an in-process miniredis.
func connect(url string, stderr io.Writer, info *RedisInfo) (target, func(), error) {
	if url != "" {
		opt, err := redis.ParseURL(url)
		if err != nil {
			return target{}, nil, fmt.Errorf("--redis: %w", err)
		}
		opt.ContextTimeoutEnabled = true
		info.Server = "existing server " + opt.Addr
		return target{opt: opt, url: url}, func() {}, nil
	}
	srv, err := startServer()
	if err == nil {
		info.Server = "throwaway redis-server at " + srv.Addr()
		return target{opt: &redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true}, srv: srv}, srv.Close, nil
	}
	if !errors.Is(err, redistest.ErrNoRedisServer) {
		return target{}, nil, err
	}
	mr := miniredis.NewMiniRedis()
	mr.ClockTTL(true) // keys expire on the machine's clock, as its TIME's and a real server's do
	if err := mr.Start(); err != nil {
		return target{}, nil, fmt.Errorf("miniredis: %w", err)
	}
	fmt.Fprintln(stderr, strings.Repeat("!", 78))
	fmt.Fprintln(stderr, "!!! redis-server is not on PATH: using in-process miniredis.")
	fmt.Fprintln(stderr, "!!! Its scripts are ~10x slower and it shares this process's CPU:")
	fmt.Fprintln(stderr, "!!! THE FIGURES ARE NOT REPRESENTATIVE. Install redis-server or pass --redis.")
	fmt.Fprintln(stderr, strings.Repeat("!", 78))
	info.Server = "in-process miniredis at " + mr.Addr()
	info.Fake = true
	return target{opt: &redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true}}, mr.Close, nil
}

// miniredisVersion is the version of the miniredis module built in, or
// "unknown".
func miniredisVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, m := range bi.Deps {
			if m.Path == "github.com/alicebob/miniredis/v2" {
				return m.Version
			}
		}
	}
	return "unknown"
}

// redisVersion reads redis_version from INFO server, or "unknown".
func redisVersion(ctx context.Context, rdb *redis.Client) string {
	return cmp.Or(rdb.InfoMap(ctx, "server").Item("Server", "redis_version"), "unknown")
}

func machine() Machine {
	host, _ := os.Hostname()
	return Machine{
		OS: runtime.GOOS, Arch: runtime.GOARCH, CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0),
		Go: runtime.Version(), Host: host, Time: time.Now().UTC().Truncate(time.Second),
	}
}
