package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"runtime"
	"time"

	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
)

// Overload is the saturated run on a starved host: the saturate
// scenario's worker processes, each with goroutines beside its callers
// that keep every CPU busy, as a container under its CPU limit or a
// process busy with its own work is. A caller that wakes too late for its
// slot takes the next one and gives its token back when it can: the
// bucket should still grant near its limit, and never above it.
type Overload struct {
	Callers  int           `json:"callers"`
	Procs    int           `json:"procs"`
	Duration time.Duration `json:"duration_ns"`
	// HogPerCPU is the busy goroutines each worker process runs per CPU
	// of the machine; Hog their number in each process.
	HogPerCPU int `json:"hog_per_cpu"`
	Hog       int `json:"hog_goroutines_per_proc"`
	Saturation
	SetupRoundTrips int64       `json:"setup_round_trips"`
	Steps           int64       `json:"scheduler_steps"`
	Fenced          int64       `json:"scheduler_fenced"`
	SchedulerErrors int64       `json:"scheduler_errors"`
	Machine         *MachineCPU `json:"machine_cpu,omitempty"`
}

// The goals of the overload scenario.
const overloadUtilGoal = 0.9

func (*Overload) about() about {
	return about{name: "overload", takes: "~10 s", all: true,
		what: "the saturated run with busy goroutines (2 a CPU) in every worker process: utilization on a starved host, the limit"}
}

func (o *Overload) flags(fs *flag.FlagSet) {
	fs.IntVar(&o.Callers, "overload-callers", 400, "callers in total, spread over the processes")
	fs.IntVar(&o.Procs, "overload-procs", 4, "worker processes")
	fs.DurationVar(&o.Duration, "overload-duration", 8*time.Second, "how long the callers keep entering")
	fs.IntVar(&o.HogPerCPU, "overload-hog", 2, "busy goroutines each worker process runs beside its callers, per CPU of the machine")
}

func (o *Overload) check() error {
	if err := checkLoad("overload-", o.Callers, o.Procs, o.Duration); err != nil {
		return err
	}
	if o.HogPerCPU < 0 {
		return fmt.Errorf("--overload-hog %d: want ≥ 0", o.HogPerCPU)
	}
	return nil
}

// run is Saturate.run in worker processes that each also run o.Hog busy
// goroutines while their callers enter.
func (o *Overload) run(ctx context.Context, e *env) error {
	tg, callers, procs, d := e.target, o.Callers, o.Procs, o.Duration
	o.Hog = o.HogPerCPU * runtime.NumCPU()
	cfg := e.limit
	cfg.Name = e.name
	l := guarantee.Limit{Capacity: cfg.Capacity, RefillAmount: cfg.RefillAmount, RefillFrequency: cfg.RefillFrequency}
	rate := float64(l.RefillAmount) / l.RefillFrequency.Seconds()
	turn := time.Duration(float64(callers) / rate * float64(time.Second))
	timeout := 30*time.Second + 4*turn
	e.logf("overload: %d callers in %d processes for %v at %.0f/s, burst %d, each process with %d busy goroutines...",
		callers, procs, d, rate, l.Capacity, o.Hog)
	specs := make([]loadgen.Spec, procs)
	for i := range specs {
		specs[i] = loadgen.Spec{Proc: i, Addr: tg.opt.Addr, URL: tg.url, Bucket: cfg, Callers: share(callers, procs, i),
			Until: d, Timeout: timeout, Hog: o.Hog}
	}
	before, haveMachine := readCPUTimes()
	grants, stats, err := inWorkers(ctx, specs, e.log)
	if after, ok := readCPUTimes(); ok && haveMachine {
		o.Machine = machineCPU(before, after)
	}
	if err != nil {
		return err
	}
	maxLate := cmp.Or(cfg.MaxLateness, defaultMaxLateness)
	o.Saturation = analyse(grants, l, min(turn, d/2), maxLate, stats.RoundTrips)
	o.SetupRoundTrips = stats.SetupRoundTrips
	o.Steps, o.Fenced, o.SchedulerErrors = stats.SchedulerSteps, stats.SchedulerFenced, stats.SchedulerErrors
	return nil
}

// NoExcess reports whether the limit held: for slots, and for starts in
// the windows the bucket promises them.
func (o *Overload) NoExcess() bool { return o.ExcessSlots.All <= 0 && o.ExcessStartsSlack <= 0 }

func (o *Overload) table(t *table, l Limit) {
	t.title("OVERLOAD: %d callers in %d processes loop Enter for %v on one bucket (capacity %d, %d every %v = %s/s); each process also runs %d busy goroutines (%d a CPU)",
		o.Callers, o.Procs, o.Duration, l.Capacity, l.RefillAmount, l.RefillFrequency, num(l.PerSecond), o.Hog, o.HogPerCPU)
	row := func(name, v, note string) { t.row(name, v, note) }
	row("", "value", "")
	tp := o.Throughput
	row("utilization", fmt.Sprintf("%.2f %%", 100*tp.Utilization),
		fmt.Sprintf("%s; grants after the initial burst / what the limit allows from the first grant time to the last (%s/s over %.3f s)",
			t.goal(tp.Utilization >= overloadUtilGoal, fmt.Sprintf("≥ %.0f %%", 100*overloadUtilGoal)), num(tp.Limit), tp.Span.Seconds()))
	note := fmt.Sprintf("%d errors", o.Errors)
	if o.Err != "" {
		note += "; first: " + o.Err
	}
	row("grants", commas(o.Grants), note)
	row("excess over the limit", fmt.Sprintf("%d", max(o.ExcessSlots.All, o.ExcessStartsSlack, 0)),
		t.goal(o.NoExcess(), "0")+fmt.Sprintf(": every grant judged, by grant time (Redis's clock) and by start time in windows MaxLateness + %s longer", dur(startSlack)))
	o.Saturation.limitRows(row)
	o.Saturation.lateRows(row)
	row("returned > MaxLateness after grant time", commas(o.Tardy), fmt.Sprintf("MaxLateness %s, by this machine's clock (the bucket judges lateness conservatively, from its own round trips)", dur(o.MaxLateness)))
	row("wait p50 / p99 / max", fmt.Sprintf("%s / %s / %s", dur(o.Wait.P50), dur(o.Wait.P99), dur(o.Wait.Max)), "queued callers, steady state")
	row("lateness p50 / p99 / max", fmt.Sprintf("%s / %s / %s", dur(o.Late.P50), dur(o.Late.P99), dur(o.Late.Max)), "how long after its grant time Enter returned, all grants")
	row("scheduler steps", commas(int(o.Steps)), fmt.Sprintf("%d refused because another process held the scheduler's lock (fenced), %d errors", o.Fenced, o.SchedulerErrors))
	if m := o.Machine; m != nil {
		row("machine CPUs during the run", m.String(), "/proc/stat, all CPUs: near 100 % busy is the point here")
	}
}

func (o *Overload) gobench(g *gobench) {
	g.line("Overload", o.Grants,
		f(o.Throughput.Utilization), "utilization",
		f(o.Throughput.Rate), "grants/s",
		o.ExcessSlots.All, "excess-slots",
		o.ExcessStartsSlack, "excess-starts-slack",
		o.Reentries, "reentries",
		f(100*per(int64(o.Reentries), o.Grants)), "pct-reentries",
		o.Retimes, "retimes",
		o.Refunds, "refunds",
		ms(o.Wait.P50), "ms-wait-p50",
		ms(o.Wait.P99), "ms-wait-p99",
		ms(o.Late.P99), "ms-late-p99",
		o.Errors, "errors")
}
