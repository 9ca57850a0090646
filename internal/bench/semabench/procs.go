package semabench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/bench/workers"
)

// EnvWorker is the environment variable that makes a binary one of
// RunProcs's worker processes (see MaybeWorker).
const EnvWorker = "SLUICE_SEMABENCH_WORKER"

// workerSpec is one worker process's share of the saturated run.
type workerSpec struct {
	Addr     string  `json:"addr"`
	Username string  `json:"username,omitempty"`
	Password string  `json:"password,omitempty"`
	DB       int     `json:"db"`
	Name     string  `json:"name"`
	Opt      Options `json:"opt"`
	Callers  int     `json:"callers"`
	Begin    int64   `json:"begin_unix_ns"` // the callers start then
}

// MaybeWorker turns this process into a worker of RunProcs when EnvWorker
// is set: it runs its callers, writes their Spans as JSON to stdout and
// exits. Call it first in main (or TestMain) of the binary RunProcs runs.
func MaybeWorker() {
	raw := os.Getenv(EnvWorker)
	if raw == "" {
		return
	}
	if err := worker(raw); err != nil {
		fmt.Fprintln(os.Stderr, "semabench worker:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

func worker(raw string) error {
	var spec workerSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rdb := redis.NewClient(&redis.Options{
		Addr: spec.Addr, Username: spec.Username, Password: spec.Password, DB: spec.DB,
		ContextTimeoutEnabled: true, PoolSize: spec.Callers + 10,
	})
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil { // connect before the start
		return err
	}
	begin := time.Unix(0, spec.Begin)
	select {
	case <-time.After(time.Until(begin)):
	case <-ctx.Done():
		return ctx.Err()
	}
	opt := spec.Opt.withDefaults()
	sp, err := Callers(ctx, rdb, spec.Name, opt, spec.Callers, begin.Add(opt.Duration))
	if err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(sp)
}

// RunProcs is Run with the saturated run's callers in procs worker
// processes (this binary run again, which must call MaybeWorker first),
// as separate processes of an application would be: each its own Go
// runtime, connections and Semaphore. The burst runs in this process on
// rdb; opt describes the server the workers connect to.
func RunProcs(ctx context.Context, rdb redis.UniversalClient, server *redis.Options, procs int, o Options) (Result, error) {
	if procs < 1 {
		return Result{}, errors.New("semabench: no processes")
	}
	opt := o.withDefaults()
	r := Result{Clients: procs, Burst: opt.Burst, Processes: procs}
	run := fmt.Sprintf("%s-%08x", opt.Name, randSuffix())
	if err := burst(ctx, rdb, run+"-burst", opt, &r); err != nil {
		return r, err
	}
	// Time for the workers to start and connect before the run begins.
	begin := time.Now().Add(time.Second)
	specs := make([]workerSpec, procs)
	for i := range specs {
		n := opt.Callers / procs
		if i < opt.Callers%procs {
			n++
		}
		specs[i] = workerSpec{
			Addr: server.Addr, Username: server.Username, Password: server.Password, DB: server.DB,
			Name: run + "-saturated", Opt: o, Callers: n, Begin: begin.UnixNano(),
		}
	}
	spans, err := workers.Run[workerSpec, Spans](ctx, EnvWorker, specs)
	if err != nil {
		return r, fmt.Errorf("semabench: %w", err)
	}
	var all Spans
	for _, sp := range spans {
		all.Holds = append(all.Holds, sp.Holds...)
		all.Lost += sp.Lost
		all.Errors += sp.Errors
	}
	Judge(&r, all, begin, opt)
	return r, nil
}
