// Command bench measures the distributed token bucket (package bucket) and
// semaphore (package semaphore) on Redis, and compares the bucket with
// other limiters. It prints a report.
//
// With no flags it starts a throwaway redis-server (or, when none is on
// PATH, an in-process miniredis whose figures are not representative) and
// runs the scenarios of "all" in under a minute:
//
//   - overhead: in one process, what Redis and the bucket cost when the
//     limit is out of reach (round trips, uncontended Enter, bursts of
//     concurrent callers, grants per second);
//   - scripts: what each of the bucket's calls costs Redis (INFO
//     commandstats), back to back and paced like a saturated run's, next
//     to the least a script costs;
//   - saturate: callers in several processes hammer one bucket; all grant
//     records are then judged together: rate and utilization, the
//     guarantee, waits, FIFO order, polls and round trips per grant;
//   - semaphore: internal/semabench (a burst of acquires, a saturated
//     semaphore over four clients) next to the goals of issue 5;
//   - compare: the same workloads against golang.org/x/time/rate, a
//     one-script GCRA reservation limiter (gcra.lua) and
//     github.com/go-redis/redis_rate, side by side with ratios to Sluice.
//
// Not in "all" (it is heavier): scale, 10,000 callers queued once on one
// bucket across 8 processes: Redis memory per waiting caller, polls and
// round trips, the guarantee over the grants.
//
// --chaos DURATION runs a soak instead: saturated callers in worker
// processes while faults happen at random (processes and redis-server
// killed, stopped, restarted; links delayed and cut; bursts of
// cancellations), judged for excess per Redis epoch, hangs and lost
// callers, with a fault log; --seed replays the fault schedule.
//
// docs/benchmarks.md defines every figure and records a run.
//
// Usage:
//
//	go run ./cmd/bench [--redis URL] [--scenario overhead,scripts,saturate,semaphore,compare,scale|all]
//	    [--capacity 50] [--refill-amount 1] [--refill-frequency 2ms]
//	    [--callers 400] [--procs 4] [--duration 10s] [--plot FILE.svg]
//	    [--compare-callers 200] [--compare-duration 3s]
//	    [--scale-callers 10000] [--scale-procs 8] [--scale-deadline 5s]
//	    [--json | --gobench]
//	go run ./cmd/bench --chaos 2m [--seed N] [--chaos-deadline 2s] [--callers 400] [--procs 4]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/guarantee"
	"github.com/sluicehq/sluice/internal/loadgen"
	"github.com/sluicehq/sluice/internal/redistest"
)

func main() {
	loadgen.MaybeWorker() // the saturate scenario's worker processes are this binary
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "bench:", err)
		}
		os.Exit(1)
	}
}

// options are the parsed flags.
type options struct {
	redisURL  string
	scenario  string
	bucket    bucket.Config
	callers   int
	procs     int
	duration  time.Duration
	json      bool
	grants    string
	gobench   bool
	plot      string
	scenarios map[string]bool

	compareCallers  int
	compareDuration time.Duration

	scaleCallers  int
	scaleProcs    int
	scaleDeadline time.Duration
	scaleStagger  time.Duration

	chaos         time.Duration
	seed          uint64
	chaosDeadline time.Duration
}

// scenarioNames in the order they run; allScenarios are those "all" runs.
var (
	scenarioNames = []string{"overhead", "scripts", "saturate", "semaphore", "compare", "scale"}
	allScenarios  = []string{"overhead", "scripts", "saturate", "semaphore", "compare"}
)

func parse(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.redisURL, "redis", "", "redis:// or rediss:// `URL` of an existing server (default: start a throwaway redis-server)")
	fs.StringVar(&o.scenario, "scenario", "all", "comma-separated scenarios: overhead, saturate, semaphore, compare, scale; all = "+strings.Join(allScenarios, ","))
	fs.IntVar(&o.bucket.Capacity, "capacity", 50, "bucket capacity: the largest burst")
	fs.IntVar(&o.bucket.RefillAmount, "refill-amount", 1, "tokens added per refill")
	fs.DurationVar(&o.bucket.RefillFrequency, "refill-frequency", 2*time.Millisecond, "time between refills")
	fs.IntVar(&o.callers, "callers", 400, "saturate: callers in total, spread over the processes")
	fs.IntVar(&o.procs, "procs", 4, "saturate: worker processes (1: callers run in this process)")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "saturate: how long callers keep entering")
	fs.BoolVar(&o.json, "json", false, "print the figures as JSON instead of the table")
	fs.StringVar(&o.grants, "grants", "", "saturate: also write every grant record to `FILE` as JSON lines")
	fs.BoolVar(&o.gobench, "gobench", false, "print the figures in the Go benchmark format (for benchstat) instead of the table")
	fs.StringVar(&o.plot, "plot", "", "saturate: draw the grant timeline against the allowed envelope and the wait histogram to `FILE` (.svg or .png)")
	fs.IntVar(&o.compareCallers, "compare-callers", 200, "compare: callers looping on the saturated limit (one process)")
	fs.DurationVar(&o.compareDuration, "compare-duration", 3*time.Second, "compare: length of each contender's saturated run")
	fs.IntVar(&o.scaleCallers, "scale-callers", 10000, "scale: callers queued once, spread over the processes")
	fs.IntVar(&o.scaleProcs, "scale-procs", 8, "scale: worker processes")
	fs.DurationVar(&o.scaleDeadline, "scale-deadline", 5*time.Second, "scale: each caller's deadline for its one Enter")
	fs.DurationVar(&o.scaleStagger, "scale-stagger", time.Second, "scale: the callers' arrivals are spread over this long")
	fs.DurationVar(&o.chaos, "chaos", 0, "run the chaos soak for `DURATION` (e.g. 2m) instead of the scenarios: saturated callers in --procs processes while faults happen at random")
	fs.Uint64Var(&o.seed, "seed", 0, "chaos: seed of the fault schedule (0: from the clock; the seed used is printed)")
	fs.DurationVar(&o.chaosDeadline, "chaos-deadline", 2*time.Second, "chaos: every Enter's deadline")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "Usage: bench [flags]\n\nMeasures the Redis token bucket; see docs/benchmarks.md.\n\nFlags:")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	o.scenarios = map[string]bool{}
	for name := range strings.SplitSeq(o.scenario, ",") {
		switch name = strings.TrimSpace(name); {
		case name == "all":
			for _, n := range allScenarios {
				o.scenarios[n] = true
			}
		case slices.Contains(scenarioNames, name):
			o.scenarios[name] = true
		default:
			return o, fmt.Errorf("--scenario %q: want a comma-separated list of %s, or all", o.scenario, strings.Join(scenarioNames, ", "))
		}
	}
	switch {
	case o.json && o.gobench:
		return o, errors.New("--json and --gobench are exclusive")
	case o.callers < 1:
		return o, fmt.Errorf("--callers %d: want ≥ 1", o.callers)
	case o.procs < 1 || o.procs > o.callers:
		return o, fmt.Errorf("--procs %d: want between 1 and --callers (%d)", o.procs, o.callers)
	case o.duration <= 0:
		return o, fmt.Errorf("--duration %v: want > 0", o.duration)
	case o.compareCallers < 1:
		return o, fmt.Errorf("--compare-callers %d: want ≥ 1", o.compareCallers)
	case o.compareDuration <= 0:
		return o, fmt.Errorf("--compare-duration %v: want > 0", o.compareDuration)
	case o.scaleProcs < 1 || o.scaleProcs > o.scaleCallers:
		return o, fmt.Errorf("--scale-procs %d: want between 1 and --scale-callers (%d)", o.scaleProcs, o.scaleCallers)
	case o.scaleDeadline <= 0 || o.scaleStagger < 0:
		return o, fmt.Errorf("--scale-deadline %v, --scale-stagger %v: want > 0 and ≥ 0", o.scaleDeadline, o.scaleStagger)
	case o.chaos < 0 || (o.chaos > 0 && o.chaos < 2*(chaosQuietHead+chaosQuietTail)):
		return o, fmt.Errorf("--chaos %v: want at least %v", o.chaos, 2*(chaosQuietHead+chaosQuietTail))
	case o.chaosDeadline <= 0:
		return o, fmt.Errorf("--chaos-deadline %v: want > 0", o.chaosDeadline)
	case o.plot != "" && !o.scenarios["saturate"]:
		return o, errors.New("--plot draws the saturate scenario: add it to --scenario")
	}
	// bucket.New checks these too, but only after the overhead scenario.
	b := o.bucket
	switch {
	case b.Capacity < 1:
		return o, fmt.Errorf("--capacity %d: want ≥ 1", b.Capacity)
	case b.RefillAmount < 1 || b.RefillAmount > b.Capacity:
		return o, fmt.Errorf("--refill-amount %d: want between 1 and --capacity (%d)", b.RefillAmount, b.Capacity)
	case b.RefillFrequency < time.Microsecond || b.RefillFrequency%time.Microsecond != 0:
		return o, fmt.Errorf("--refill-frequency %v: want a whole number of microseconds, ≥ 1µs", b.RefillFrequency)
	}
	return o, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	o, err := parse(args, stderr)
	if err != nil {
		return err
	}
	rep := Report{
		Machine: machine(),
		Limit: Limit{
			Capacity: o.bucket.Capacity, RefillAmount: o.bucket.RefillAmount, RefillFrequency: o.bucket.RefillFrequency,
			PerSecond: float64(o.bucket.RefillAmount) / o.bucket.RefillFrequency.Seconds(),
		},
	}
	tg, closeServer, err := connect(o.redisURL, stderr, &rep.Redis)
	if err != nil {
		return err
	}
	defer closeServer()
	probe := client(tg.opt, 1)
	rep.Redis.Version = redisVersion(ctx, probe)
	if rep.Redis.Fake {
		rep.Redis.Version = "miniredis " + rep.Redis.Version
	}
	probe.Close()

	name := fmt.Sprintf("bench-%d-%d", os.Getpid(), time.Now().UnixNano())
	if o.chaos > 0 {
		if o.seed == 0 {
			o.seed = uint64(time.Now().UnixNano())
		}
		cfg := o.bucket
		cfg.Name = name + "-chaos"
		c, err := chaosSoak(ctx, tg, cfg, o.callers, o.procs, o.chaos, o.chaosDeadline, o.seed, stderr)
		if err != nil {
			return fmt.Errorf("chaos (seed %d): %w", o.seed, err)
		}
		rep.Chaos = &c
		o.scenarios = nil
	}
	if o.scenarios["overhead"] {
		fmt.Fprintln(stderr, "overhead: round trips, uncontended Enter, concurrent callers, grants/s...")
		ov, err := overhead(ctx, tg.opt, name)
		if err != nil {
			return fmt.Errorf("overhead: %w", err)
		}
		rep.Overhead = &ov
	}
	if o.scenarios["scripts"] {
		sc, err := scriptsScenario(ctx, tg.opt, name+"-scripts", stderr)
		if err != nil {
			return fmt.Errorf("scripts: %w", err)
		}
		rep.Scripts = &sc
	}
	if o.scenarios["saturate"] {
		cfg := o.bucket
		cfg.Name = name + "-saturate"
		s, grants, err := saturate(ctx, tg, cfg, o.callers, o.procs, o.duration, o.grants, stderr)
		if err != nil {
			return fmt.Errorf("saturate: %w", err)
		}
		rep.Saturate = &s
		if o.plot != "" {
			l := guarantee.Limit{Capacity: cfg.Capacity, Amount: cfg.RefillAmount, Every: cfg.RefillFrequency}
			if err := writePlot(o.plot, grants, l, s.Saturation); err != nil {
				return err
			}
			fmt.Fprintf(stderr, "saturate: plot written to %s\n", o.plot)
		}
	}
	if o.scenarios["semaphore"] {
		sm, err := semaphoreScenario(ctx, tg.opt, name+"-sema", stderr)
		if err != nil {
			return fmt.Errorf("semaphore: %w", err)
		}
		rep.Semaphore = &sm
	}
	if o.scenarios["compare"] {
		c, err := compare(ctx, tg.opt, name+"-compare", o.bucket, o.compareCallers, o.compareDuration, stderr)
		if err != nil {
			return fmt.Errorf("compare: %w", err)
		}
		rep.Compare = &c
	}
	if o.scenarios["scale"] {
		cfg := o.bucket
		cfg.Name = name + "-scale"
		sc, err := scale(ctx, tg, cfg, o.scaleCallers, o.scaleProcs, o.scaleDeadline, o.scaleStagger, stderr)
		if err != nil {
			return fmt.Errorf("scale: %w", err)
		}
		rep.Scale = &sc
	}
	switch {
	case o.json:
		return writeJSON(stdout, rep)
	case o.gobench:
		return writeGobench(stdout, rep)
	}
	return writeTable(stdout, rep)
}

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
	srv, err := redistest.Start()
	if err == nil {
		info.Server = "throwaway redis-server at " + srv.Addr()
		return target{opt: &redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true}, srv: srv}, srv.Close, nil
	}
	if !errors.Is(err, redistest.ErrNoRedisServer) {
		return target{}, nil, err
	}
	mr, err := miniredis.Run()
	if err != nil {
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

// redisVersion reads redis_version from INFO server, or "unknown".
func redisVersion(ctx context.Context, rdb *redis.Client) string {
	info, err := rdb.Info(ctx, "server").Result()
	if err != nil {
		return "unknown"
	}
	for line := range strings.SplitSeq(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "redis_version:"); ok {
			return v
		}
	}
	return "unknown"
}

func machine() Machine {
	host, _ := os.Hostname()
	return Machine{
		OS: runtime.GOOS, Arch: runtime.GOARCH, CPUs: runtime.NumCPU(), GOMAXPROCS: runtime.GOMAXPROCS(0),
		Go: runtime.Version(), Host: host, Time: time.Now().UTC().Truncate(time.Second),
	}
}
