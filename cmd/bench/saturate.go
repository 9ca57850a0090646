package main

import (
	"bufio"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
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

	grants, plot string // --grants, --plot: files to write
}

// workerStartup is how long after their start worker processes begin
// entering, together.
const workerStartup = 500 * time.Millisecond

func (*Saturate) about() about {
	return about{name: "saturate", takes: "~12 s", all: true,
		what: "callers in several processes hammer one bucket; every grant judged: rate, guarantee, waits, order, cost"}
}

func (s *Saturate) flags(fs *flag.FlagSet) {
	fs.IntVar(&s.Callers, "callers", 400, "callers in total, spread over the processes")
	fs.IntVar(&s.Procs, "procs", 4, "worker processes (1: the callers run in this process)")
	fs.DurationVar(&s.Duration, "duration", 10*time.Second, "how long the callers keep entering")
	fs.StringVar(&s.grants, "grants", "", "also write every grant record to `FILE` as JSON lines")
	fs.StringVar(&s.plot, "plot", "", "draw the grant timeline against the allowed envelope and the wait histogram to `FILE` (.svg or .png)")
}

func (s *Saturate) check() error { return checkLoad("", s.Callers, s.Procs, s.Duration) }

// checkLoad checks the flags of a scenario whose callers, spread over
// worker processes, enter for a while: --<prefix>callers, --<prefix>procs
// and --<prefix>duration.
func checkLoad(prefix string, callers, procs int, d time.Duration) error {
	switch {
	case callers < 1:
		return fmt.Errorf("--%scallers %d: want ≥ 1", prefix, callers)
	case procs < 1 || procs > callers:
		return fmt.Errorf("--%sprocs %d: want between 1 and --%scallers (%d)", prefix, procs, prefix, callers)
	case d <= 0:
		return fmt.Errorf("--%sduration %v: want > 0", prefix, d)
	}
	return nil
}

// run has s.Callers callers spread over s.Procs processes (1: this one)
// loop Enter on one bucket for s.Duration, and analyses all grants
// together.
func (s *Saturate) run(ctx context.Context, e *env) error {
	tg, callers, procs, d := e.target, s.Callers, s.Procs, s.Duration
	cfg := e.limit
	cfg.Name = e.name
	l := guarantee.Limit{Capacity: cfg.Capacity, RefillAmount: cfg.RefillAmount, RefillFrequency: cfg.RefillFrequency}
	rate := float64(l.RefillAmount) / l.RefillFrequency.Seconds()
	// A caller that re-enters at once finds the other callers ahead of it:
	// from then on it waits about callers/rate; wait longer before giving
	// up on a stuck Enter (recorded as an error).
	turn := time.Duration(float64(callers) / rate * float64(time.Second))
	timeout := 30*time.Second + 4*turn
	e.logf("saturate: %d callers in %d process(es) for %v at %.0f/s, burst %d...", callers, procs, d, rate, l.Capacity)

	specs := make([]loadgen.Spec, procs)
	for i := range specs {
		specs[i] = loadgen.Spec{Proc: i, Addr: tg.opt.Addr, URL: tg.url, Bucket: cfg, Callers: share(callers, procs, i), Until: d, Timeout: timeout}
	}
	probe := client(tg.opt, 1)
	defer probe.Close()
	before, cpuErr := readCPU(ctx, probe)
	machineBefore, haveMachine := readCPUTimes()
	// The floor script, one per 4 grants (at most 500/s): spread out like
	// the bucket's calls, and too few to change the process CPU figure much.
	floorCtx, stopFloor := context.WithCancel(ctx)
	var floor sync.WaitGroup
	floor.Go(func() {
		paceFloor(floorCtx, probe, max(time.Duration(4*float64(time.Second)/rate), 2*time.Millisecond))
	})
	var (
		grants []loadgen.Grant
		stats  loadgen.WorkerStats
		err    error
	)
	if procs == 1 {
		grants, stats, err = inProcess(ctx, tg.opt, specs[0])
	} else {
		grants, stats, err = inWorkers(ctx, specs, e.log)
	}
	stopFloor()
	floor.Wait()
	if machineAfter, ok := readCPUTimes(); ok && haveMachine {
		s.Machine = machineCPU(machineBefore, machineAfter)
	}
	if err != nil {
		return err
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
		e.logf("saturate: no Redis CPU figures: %v", cpuErr)
	}
	if s.grants != "" {
		if err := writeGrants(s.grants, grants); err != nil {
			return err
		}
	}
	maxLate := cmp.Or(cfg.MaxLateness, defaultMaxLateness)
	s.Saturation = analyse(grants, l, min(turn, d/2), maxLate, stats.RoundTrips)
	s.SetupRoundTrips = stats.SetupRoundTrips
	s.Steps, s.Fenced, s.SchedulerErrors = stats.SchedulerSteps, stats.SchedulerFenced, stats.SchedulerErrors
	if s.plot != "" {
		if err := writePlot(s.plot, grants, l, s.Saturation); err != nil {
			return err
		}
		e.logf("saturate: plot written to %s", s.plot)
	}
	return nil
}

func (s *Saturate) table(t *table, l Limit) {
	t.title("SATURATE: %d callers in %d process(es) loop Enter for %v on one bucket: capacity %d, %d every %v = %s/s",
		s.Callers, s.Procs, s.Duration, l.Capacity, l.RefillAmount, l.RefillFrequency, num(l.PerSecond))
	val := func(name, v, note string) { t.row(name, v, "", "", note) }
	val("", "value", "")
	note := fmt.Sprintf("%d errors", s.Errors)
	if s.Err != "" {
		note += "; first: " + s.Err
	}
	val("grants", commas(s.Grants), note)
	tp := s.Throughput
	val("rate after the initial burst", num(tp.Rate)+"/s", fmt.Sprintf("(grants − capacity) / %.3f s from the first grant time to the last", tp.Span.Seconds()))
	val("utilization", fmt.Sprintf("%.2f %%", 100*tp.Utilization), fmt.Sprintf("rate / limit (%s/s)", num(tp.Limit)))
	s.Saturation.limitRows(val)
	val("wait max / median", fmt.Sprintf("%.3f", s.MaxOverMedian), "queued callers, steady state")
	val("grants overtaken, by grant time", pct(s.OvertakenSlot, s.Grants), fmt.Sprintf("%d callers granted later than one that reached Redis after them", s.OvertakenSlot))
	val("grants overtaken, by start time", pct(s.OvertakenStart, s.Grants), fmt.Sprintf("%d callers that one reaching Redis after them started > %s before", s.OvertakenStart, dur(s.StartTol)))
	val("polls per queued caller", fmt.Sprintf("%.3f", s.PollsPerQueued), fmt.Sprintf("times a queued caller asked Redis for its grant time; %s queued grants; max %d polls", commas(s.Queued), s.MaxPolls))
	val("round trips per grant, all", fmt.Sprintf("%.3f", s.RoundTripsPerGrant()), fmt.Sprintf("%s commands and pipelines sent by all processes; connection handshakes (%s) left out", commas(int(s.RoundTrips)), commas(int(s.SetupRoundTrips))))
	val("round trips per grant, callers", fmt.Sprintf("%.3f", s.CallerRoundTripsPerGrant()), "the calls to Redis each caller waited for; a batched call counts for every caller in it")
	val("returned > 100 µs before grant time", commas(s.Early), "")
	val("returned > MaxLateness after grant time", commas(s.Tardy), fmt.Sprintf("MaxLateness %s, by this machine's clock (the bucket judges lateness conservatively, from its own round trips)", dur(s.MaxLateness)))
	s.Saturation.lateRows(val)
	val("scheduler steps", commas(int(s.Steps)), fmt.Sprintf("%d refused because another process held the scheduler's lock (fenced), %d errors", s.Fenced, s.SchedulerErrors))
	if m := s.Machine; m != nil {
		val("machine CPUs during the run", m.String(), "/proc/stat, all CPUs: stolen = time the hypervisor ran other VMs; tails grow with both")
	}
	if c := s.RedisCPU; c != nil {
		shared := "server used by this run only"
		if c.Shared {
			shared = "SHARED server (--redis): other clients count too, an upper bound"
		}
		val("Redis time per grant, commands", dur(c.PerGrant), fmt.Sprintf("%s; INFO commandstats Δ usec %s (scripts %s) / grants, inner commands not counted twice; %s",
			t.goal(c.PerGrant <= redisCPUGoal, "≤ "+dur(redisCPUGoal)), dur(time.Duration(c.CommandsUsec)*time.Microsecond), dur(time.Duration(c.ScriptsUsec)*time.Microsecond), shared))
		val("Redis CPU per grant, process", dur(c.ProcessCPUPerGrant), fmt.Sprintf("INFO used_cpu_sys + used_cpu_user Δ %s / grants: all threads, I/O and event loop included", dur(c.ProcessCPU)))
		val("  costliest commands", "", c.topString(4))
		if c.FloorUsec > 0 {
			val("  one-line script, same pace", dur(time.Duration(c.FloorUsec*float64(time.Microsecond))),
				fmt.Sprintf("EVAL %q sent alone, one per 4 grants, during the run: a grant costs Redis %.1f of them", floorScript, c.PerGrantFloors))
		}
	}
	t.Flush() // a block of its own: the values above are wide
	t.row("", "p50", "p99", "max", "")
	t.dist("wait, queued callers, steady state", s.Wait, fmt.Sprintf("%s Enters begun ≥ %v after the first", commas(s.Wait.N), s.Warmup.Round(time.Millisecond)))
	t.dist("lateness: Enter's return after grant time", s.Late, "all grants")
	t.dist("lateness, steady state", s.LateSteady, fmt.Sprintf("%s Enters begun ≥ %v after the first", commas(s.LateSteady.N), s.Warmup.Round(time.Millisecond)))
	t.dist("  of those told their grant time before it came", s.LateInTime, fmt.Sprintf("what the final wait itself adds; %s were told at or after their grant time (late before the final wait began)", commas(s.LateAnswer)))
}

func (s *Saturate) gobench(g *gobench) {
	g.line("Saturate", s.Grants,
		f(s.Throughput.Utilization), "utilization",
		f(s.Throughput.Rate), "grants/s",
		s.ExcessSlots.All, "excess-slots",
		s.ExcessStarts.All, "excess-starts",
		s.ExcessStartsSlack, "excess-starts-slack",
		ms(s.Wait.P50), "ms-wait-p50",
		ms(s.Wait.P99), "ms-wait-p99",
		ms(s.Wait.Max), "ms-wait-max",
		f(s.MaxOverMedian), "max/median",
		f(100*per(int64(s.OvertakenSlot), s.Grants)), "pct-overtaken-slot",
		f(100*per(int64(s.OvertakenStart), s.Grants)), "pct-overtaken-start",
		f(s.PollsPerQueued), "polls/waiter",
		f(s.RoundTripsPerGrant()), "round-trips/op",
		ms(s.Late.P50), "ms-late-p50",
		ms(s.Late.P99), "ms-late-p99",
		ms(s.LateSteady.P99), "ms-late-steady-p99",
		s.Tardy, "tardy",
		s.Reentries, "reentries",
		s.Retimes, "retimes",
		s.Refunds, "refunds",
		s.Errors, "errors")
	if c := s.RedisCPU; c != nil {
		g.line("Saturate/redis-cpu", s.Grants, f(float64(c.PerGrant)/float64(time.Microsecond)), "redis-us/op",
			f(float64(c.ProcessCPUPerGrant)/float64(time.Microsecond)), "redis-process-cpu-us/op",
			f(c.FloorUsec), "one-line-script-us", f(c.PerGrantFloors), "one-line-scripts/op")
	}
}

// share is how many of callers spread over procs processes the i-th gets.
func share(callers, procs, i int) int {
	if i < callers%procs {
		return callers/procs + 1
	}
	return callers / procs
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
	stopped := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(stopped)
		for _, p := range procs {
			p.Stop()
		}
	})
	defer func() {
		if !stop() {
			<-stopped
		}
	}()
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
