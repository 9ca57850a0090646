// Command bench measures the distributed token bucket (package bucket) on
// Redis and prints a report.
//
// With no flags it starts a throwaway redis-server (or, when none is on
// PATH, an in-process miniredis whose figures are not representative) and
// runs both scenarios in about 20 seconds:
//
//   - overhead: in one process, what Redis and the bucket cost when the
//     limit is out of reach (round trips, uncontended Enter, bursts of
//     concurrent callers, grants per second);
//   - saturate: callers in several processes hammer one bucket; all grant
//     records are then judged together: rate and utilization, the
//     guarantee, waits, FIFO order, polls and round trips per grant.
//
// docs/benchmarks.md defines every figure and records a run.
//
// Usage:
//
//	go run ./cmd/bench [--redis URL] [--scenario overhead|saturate|all]
//	    [--capacity 50] [--refill-amount 1] [--refill-frequency 2ms]
//	    [--callers 400] [--procs 4] [--duration 10s] [--json | --gobench]
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
	"strings"
	"syscall"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
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
	scenarios map[string]bool
}

func parse(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.redisURL, "redis", "", "redis:// or rediss:// `URL` of an existing server (default: start a throwaway redis-server)")
	fs.StringVar(&o.scenario, "scenario", "all", "overhead | saturate | all")
	fs.IntVar(&o.bucket.Capacity, "capacity", 50, "bucket capacity: the largest burst")
	fs.IntVar(&o.bucket.RefillAmount, "refill-amount", 1, "tokens added per refill")
	fs.DurationVar(&o.bucket.RefillFrequency, "refill-frequency", 2*time.Millisecond, "time between refills")
	fs.IntVar(&o.callers, "callers", 400, "saturate: callers in total, spread over the processes")
	fs.IntVar(&o.procs, "procs", 4, "saturate: worker processes (1: callers run in this process)")
	fs.DurationVar(&o.duration, "duration", 10*time.Second, "saturate: how long callers keep entering")
	fs.BoolVar(&o.json, "json", false, "print the figures as JSON instead of the table")
	fs.StringVar(&o.grants, "grants", "", "saturate: also write every grant record to `FILE` as JSON lines")
	fs.BoolVar(&o.gobench, "gobench", false, "print the figures in the Go benchmark format (for benchstat) instead of the table")
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
	switch o.scenario {
	case "overhead", "saturate":
		o.scenarios = map[string]bool{o.scenario: true}
	case "all":
		o.scenarios = map[string]bool{"overhead": true, "saturate": true}
	default:
		return o, fmt.Errorf("--scenario %q: want overhead, saturate or all", o.scenario)
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
	if o.scenarios["overhead"] {
		fmt.Fprintln(stderr, "overhead: round trips, uncontended Enter, concurrent callers, grants/s...")
		ov, err := overhead(ctx, tg.opt, name)
		if err != nil {
			return fmt.Errorf("overhead: %w", err)
		}
		rep.Overhead = &ov
	}
	if o.scenarios["saturate"] {
		cfg := o.bucket
		cfg.Name = name + "-saturate"
		s, err := saturate(ctx, tg, cfg, o.callers, o.procs, o.duration, o.grants, stderr)
		if err != nil {
			return fmt.Errorf("saturate: %w", err)
		}
		rep.Saturate = &s
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
		return target{opt: &redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true}}, srv.Close, nil
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
