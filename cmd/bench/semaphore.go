package main

import (
	"context"
	"flag"

	"github.com/sluicehq/sluice/internal/bench/semabench"
)

// Semaphore is the figures of the semaphore's benchmark
// (internal/bench/semabench) with the goals they are held to.
type Semaphore struct {
	semabench.Result
	OK   bool            `json:"ok"` // every goal met
	Rows []semabench.Row `json:"-"`
}

// semaphoreProcs is how many OS processes the semaphore scenario's
// saturated run spreads its 100 callers over.
const semaphoreProcs = 4

// The saturated run's worker processes are this binary run again; here
// rather than in main so that the scenario stays in its file.
func init() { semabench.MaybeWorker() }

func (*Semaphore) about() about {
	return about{name: "semaphore", takes: "~3 s", all: true,
		what: "the distributed semaphore: a burst of acquires, then 100 callers in 4 OS processes on 10 permits, against its goals"}
}

func (*Semaphore) flags(*flag.FlagSet) {}
func (*Semaphore) check() error        { return nil }

// run runs internal/bench/semabench with its defaults (a burst of 100 in this
// process, then 10 permits, 5 ms holds, 100 callers) with the saturated
// run in semaphoreProcs OS processes: each its own runtime, connection
// pool and Semaphore, as an application's processes would be.
func (sm *Semaphore) run(ctx context.Context, e *env) error {
	e.logf("semaphore: burst of 100 acquires, then 100 callers in %d processes on 10 permits...", semaphoreProcs)
	c := client(e.opt, 100)
	defer c.Close()
	r, err := semabench.RunProcs(ctx, c, e.opt, semaphoreProcs, semabench.Options{Name: e.name})
	if err != nil {
		return err
	}
	*sm = Semaphore{Result: r, OK: r.OK(), Rows: r.Rows()}
	return nil
}

func (sm *Semaphore) table(t *table, _ Limit) {
	t.title("SEMAPHORE: the saturated run in %d OS processes, against the semaphore's goals", sm.Processes)
	t.row("", "value", "")
	for _, x := range sm.Rows {
		verdict := ""
		if x.Goal != "" {
			verdict = t.goal(x.OK, x.Goal)
		}
		t.row(x.Metric, x.Value, verdict)
	}
}

func (sm *Semaphore) gobench(g *gobench) {
	g.line("Semaphore/burst", sm.Burst, ns(sm.BurstMedian), "ns/burst", ns(sm.BurstMax), "max-ns/burst")
	g.line("Semaphore/saturated", sm.Holds, f(sm.HoldsPerSec), "holds/s", f(sm.Utilization), "utilization",
		ms(sm.WaitP50), "ms-wait-p50", ms(sm.WaitP99), "ms-wait-p99", ms(sm.WaitP99-sm.WaitIdeal), "ms-p99-over-ideal",
		ms(sm.HandoffP50), "ms-handoff-p50", ms(sm.HandoffP99), "ms-handoff-p99",
		sm.Violations, "violations", sm.Lost, "lost", sm.Errors, "errors")
}
