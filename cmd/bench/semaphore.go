package main

import (
	"context"
	"flag"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/semabench"
)

// Semaphore is the figures of the semaphore's benchmark
// (internal/semabench) with the goals they are held to.
type Semaphore struct {
	semabench.Result
	OK   bool            `json:"ok"` // every goal met
	Rows []semabench.Row `json:"-"`
}

// semaphoreProcs is how many processes the semaphore scenario simulates:
// 100 callers in 4 processes.
const semaphoreProcs = 4

func (*Semaphore) about() about {
	return about{name: "semaphore", takes: "~3 s", all: true,
		what: "the distributed semaphore: a burst of acquires, then 100 callers in 4 clients on 10 permits, against its goals"}
}

func (*Semaphore) flags(*flag.FlagSet) {}
func (*Semaphore) check() error        { return nil }

// run runs internal/semabench with its defaults (a burst of 100, then 10
// permits, 5 ms holds, 100 callers) over semaphoreProcs clients, each
// standing for one process: its own connection pool, its own Semaphore
// (process id, wake-up subscription). They share this OS process.
func (sm *Semaphore) run(ctx context.Context, e *env) error {
	e.logf("semaphore: burst of 100 acquires, then 100 callers in %d clients on 10 permits...", semaphoreProcs)
	clients := make([]redis.UniversalClient, semaphoreProcs)
	for i := range clients {
		c := client(e.opt, 100)
		defer c.Close()
		clients[i] = c
	}
	r, err := semabench.Run(ctx, clients, semabench.Options{Name: e.name})
	if err != nil {
		return err
	}
	*sm = Semaphore{Result: r, OK: r.OK(), Rows: r.Rows()}
	return nil
}

func (sm *Semaphore) table(t *table, _ Limit) {
	t.title("SEMAPHORE: %d clients, each as one process would be (all in this process), against the semaphore's goals", sm.Clients)
	t.row("", "value", "")
	for _, x := range sm.Rows {
		verdict := ""
		if x.Goal != "" {
			verdict = goal(x.OK, x.Goal)
		}
		t.row(x.Metric, x.Value, verdict)
	}
}

func (sm *Semaphore) gobench(g *gobench) {
	g.line("Semaphore/burst", sm.Burst, ns(sm.BurstMedian), "ns/burst", ns(sm.BurstMax), "max-ns/burst")
	g.line("Semaphore/saturated", sm.Holds, f(sm.HoldsPerSec), "holds/s", f(sm.Utilization), "utilization",
		ms(sm.WaitP50), "ms-wait-p50", ms(sm.WaitP99), "ms-wait-p99", ms(sm.WaitP99-sm.WaitIdeal), "ms-p99-over-ideal",
		sm.Violations, "violations", sm.Lost, "lost", sm.Errors, "errors")
}
