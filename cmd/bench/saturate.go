package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/guarantee"
	"github.com/sluicehq/sluice/internal/loadgen"
	"github.com/sluicehq/sluice/internal/redistest"
)

// Saturate is the saturated run: its set-up and the analysis of all its
// grants.
type Saturate struct {
	Callers  int           `json:"callers"`
	Procs    int           `json:"procs"`
	Duration time.Duration `json:"duration_ns"`
	Saturation
	// SetupRoundTrips are the connection handshakes of all processes,
	// left out of RoundTrips.
	SetupRoundTrips int64 `json:"setup_round_trips"`
	// Scheduler counters summed over the processes.
	Steps           int64 `json:"scheduler_steps"`
	Fenced          int64 `json:"scheduler_fenced"`
	SchedulerErrors int64 `json:"scheduler_errors"`
	// RedisCPU is what the run cost the server (INFO commandstats and
	// INFO cpu before and after); nil when the server does not report it
	// (miniredis).
	RedisCPU *RedisCPU `json:"redis_cpu,omitempty"`
	// Machine is how all CPUs of the machine spent the run (Linux only).
	Machine *MachineCPU `json:"machine_cpu,omitempty"`
}

// workerStartup is how long after their start worker processes begin
// entering, together.
const workerStartup = 500 * time.Millisecond

// target says where the callers connect.
type target struct {
	opt *redis.Options
	url string // --redis, passed on to worker processes; "" for a local server
	// srv is the throwaway redis-server this command started, nil for
	// --redis or miniredis: only it may be killed, paused and restarted.
	srv *redistest.Server
}

// saturate runs callers spread over procs processes (1: this one), each
// looping Enter on one bucket for d, and analyses all grants together.
func saturate(ctx context.Context, tg target, cfg bucket.Config, callers, procs int, d time.Duration, dump string, stderr io.Writer) (Saturate, []loadgen.Grant, error) {
	s := Saturate{Callers: callers, Procs: procs, Duration: d}
	l := guarantee.Limit{Capacity: cfg.Capacity, Amount: cfg.RefillAmount, Every: cfg.RefillFrequency}
	rate := float64(l.Amount) / l.Every.Seconds()
	// A caller that re-enters at once finds the other callers ahead of it:
	// from then on it waits about callers/rate; wait longer before giving
	// up on a stuck Enter (recorded as an error).
	turn := time.Duration(float64(callers) / rate * float64(time.Second))
	timeout := 30*time.Second + 4*turn
	fmt.Fprintf(stderr, "saturate: %d callers in %d process(es) for %v at %.0f/s, burst %d...\n", callers, procs, d, rate, l.Capacity)

	specs := make([]loadgen.Spec, procs)
	for i := range specs {
		n := callers / procs
		if i < callers%procs {
			n++
		}
		specs[i] = loadgen.Spec{Proc: i, Addr: tg.opt.Addr, URL: tg.url, Bucket: cfg, Callers: n, Until: d, Timeout: timeout}
	}
	probe := client(tg.opt, 1)
	defer probe.Close()
	before, cpuErr := readCPU(ctx, probe)
	machineBefore, haveMachine := readCPUTimes()
	// The floor script, one per 4 grants (at most 500/s): spread out like
	// the bucket's calls, and too few to change the process CPU figure much.
	floorCtx, stopFloor := context.WithCancel(ctx)
	floorDone := make(chan struct{})
	go func() {
		defer close(floorDone)
		paceFloor(floorCtx, probe, max(time.Duration(4*float64(time.Second)/rate), 2*time.Millisecond))
	}()
	var (
		grants []loadgen.Grant
		stats  loadgen.WorkerStats
		err    error
	)
	if procs == 1 {
		grants, stats, err = inProcess(ctx, tg.opt, specs[0])
	} else {
		grants, stats, err = inWorkers(ctx, specs, stderr)
	}
	stopFloor()
	<-floorDone
	if machineAfter, ok := readCPUTimes(); ok && haveMachine {
		s.Machine = machineCPU(machineBefore, machineAfter)
	}
	if err != nil {
		return s, nil, err
	}
	if cpuErr == nil {
		var after cpuSample
		if after, cpuErr = readCPU(ctx, probe); cpuErr == nil {
			n := 0
			for _, g := range grants {
				if g.OK() {
					n++
				}
			}
			c := redisCPU(before, after, n, tg.url != "")
			s.RedisCPU = &c
		}
	}
	if cpuErr != nil {
		fmt.Fprintf(stderr, "saturate: no Redis CPU figures: %v\n", cpuErr)
	}
	if dump != "" {
		if err := writeGrants(dump, grants); err != nil {
			return s, nil, err
		}
	}
	maxLate := cfg.MaxLateness
	if maxLate == 0 {
		maxLate = defaultMaxLateness
	}
	s.Saturation = analyse(grants, l, min(turn, d/2), maxLate, stats.RoundTrips)
	s.SetupRoundTrips = stats.SetupRoundTrips
	s.Steps, s.Fenced, s.SchedulerErrors = stats.SchedulerSteps, stats.SchedulerFenced, stats.SchedulerErrors
	return s, grants, nil
}

// inProcess runs spec's callers in this process.
func inProcess(ctx context.Context, opt *redis.Options, spec loadgen.Spec) ([]loadgen.Grant, loadgen.WorkerStats, error) {
	var st loadgen.WorkerStats
	rdb := client(opt, spec.Callers)
	defer rdb.Close()
	var rt loadgen.RoundTripCounter
	rdb.AddHook(&rt)
	b, err := bucket.New(rdb, spec.Bucket)
	if err != nil {
		return nil, st, err
	}
	var mu sync.Mutex
	var grants []loadgen.Grant
	loadgen.Run(ctx, b, spec, func(g loadgen.Grant) {
		mu.Lock()
		grants = append(grants, g)
		mu.Unlock()
	})
	b.Close()
	if err := ctx.Err(); err != nil {
		return nil, st, err
	}
	ss := b.Stats()
	st = loadgen.WorkerStats{RoundTrips: rt.RoundTrips(), SetupRoundTrips: rt.Setup(), SchedulerSteps: ss.Steps, SchedulerFenced: ss.Fenced, SchedulerErrors: ss.Errors}
	return grants, st, nil
}

// inWorkers runs each spec in a worker process (this binary re-executed)
// and gathers their grants and counters.
func inWorkers(ctx context.Context, specs []loadgen.Spec, stderr io.Writer) ([]loadgen.Grant, loadgen.WorkerStats, error) {
	var total loadgen.WorkerStats
	var procs []*loadgen.Proc
	stopAll := func() {
		for _, p := range procs {
			p.Stop()
		}
		for _, p := range procs {
			<-p.Done()
		}
	}
	// Workers take a few tens of ms to start; let them all begin together.
	startAt := time.Now().Add(workerStartup)
	for _, spec := range specs {
		spec.StartAt = startAt.UnixNano()
		p, err := loadgen.Start(spec)
		if err != nil {
			stopAll()
			return nil, total, fmt.Errorf("start worker: %w", err)
		}
		procs = append(procs, p)
	}
	for _, p := range procs {
		select {
		case <-p.Ready():
		case <-ctx.Done():
		}
	}
	if late := time.Since(startAt); late > 0 && ctx.Err() == nil {
		fmt.Fprintf(stderr, "saturate: warning: the last worker was ready %v after the common start\n", late.Round(time.Millisecond))
	}
	// Stop the workers early if we are interrupted.
	finished := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		select {
		case <-ctx.Done():
			for _, p := range procs {
				p.Stop()
			}
		case <-finished:
		}
	})
	var (
		grants []loadgen.Grant
		errs   []error
	)
	for _, p := range procs {
		g, err := p.Wait()
		grants = append(grants, g...)
		if err != nil {
			errs = append(errs, fmt.Errorf("worker %d: %w", p.Pid(), err))
		}
		st, ok := p.Stats()
		if !ok {
			errs = append(errs, fmt.Errorf("worker %d: no totals reported", p.Pid()))
		}
		total.RoundTrips += st.RoundTrips
		total.SetupRoundTrips += st.SetupRoundTrips
		total.SchedulerSteps += st.SchedulerSteps
		total.SchedulerFenced += st.SchedulerFenced
		total.SchedulerErrors += st.SchedulerErrors
	}
	close(finished)
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return nil, total, err
	}
	return grants, total, errors.Join(errs...)
}

// writeGrants writes grants to the file path, one JSON object a line.
func writeGrants(path string, grants []loadgen.Grant) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	enc := json.NewEncoder(w)
	for _, g := range grants {
		if err := enc.Encode(g); err != nil {
			f.Close()
			return err
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
