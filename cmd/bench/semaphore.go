package main

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/semabench"
)

// Semaphore is the figures of internal/semabench (issue 5) with the goals
// they are held to.
type Semaphore struct {
	Clients int `json:"clients"` // simulated processes: one client and one Semaphore each

	Burst       int           `json:"burst"` // concurrent acquires in one process, capacity to spare
	BurstMedian time.Duration `json:"burst_median_ns"`
	BurstMax    time.Duration `json:"burst_max_ns"`

	Capacity    int           `json:"capacity"`
	Callers     int           `json:"callers"`
	Hold        time.Duration `json:"hold_ns"`
	HoldMean    time.Duration `json:"hold_mean_ns"`
	Handoff     time.Duration `json:"handoff_ns"`
	Window      time.Duration `json:"window_ns"`
	Holds       int           `json:"holds"`
	HoldsPerSec float64       `json:"holds_per_s"`
	Possible    float64       `json:"possible_per_s"`
	Utilization float64       `json:"utilization"`
	WaitP50     time.Duration `json:"wait_p50_ns"`
	WaitP99     time.Duration `json:"wait_p99_ns"`
	WaitIdeal   time.Duration `json:"wait_ideal_ns"`

	Intervals  int `json:"intervals"`
	Peak       int `json:"peak"`
	Violations int `json:"violations"`
	Lost       int `json:"lost"`
	Errors     int `json:"errors"`

	OK   bool            `json:"ok"` // every goal met
	Rows []semabench.Row `json:"-"`
}

// semaphoreProcs is how many processes the semaphore scenario simulates
// (issue 5: 100 callers in 4 processes).
const semaphoreProcs = 4

// semaphoreScenario runs internal/semabench with its defaults (a burst of
// 100, then 10 permits, 5 ms holds, 100 callers) over semaphoreProcs
// clients, each standing for one process: its own connection pool, its own
// Semaphore (process id, wake-up subscription). They share this OS process.
func semaphoreScenario(ctx context.Context, opt *redis.Options, name string, stderr io.Writer) (Semaphore, error) {
	fmt.Fprintf(stderr, "semaphore: burst of 100 acquires, then 100 callers in %d clients on 10 permits...\n", semaphoreProcs)
	clients := make([]redis.UniversalClient, semaphoreProcs)
	for i := range clients {
		c := client(opt, 100)
		defer c.Close()
		clients[i] = c
	}
	r, err := semabench.Run(ctx, clients, semabench.Options{Name: name})
	if err != nil {
		return Semaphore{}, err
	}
	return Semaphore{
		Clients: r.Clients, Burst: r.Burst, BurstMedian: r.BurstMedian, BurstMax: r.BurstMax,
		Capacity: r.Capacity, Callers: r.Callers, Hold: r.Hold, HoldMean: r.HoldMean, Handoff: r.Handoff,
		Window: r.Window, Holds: r.Holds, HoldsPerSec: r.HoldsPerSec, Possible: r.Possible, Utilization: r.Utilization,
		WaitP50: r.WaitP50, WaitP99: r.WaitP99, WaitIdeal: r.WaitIdeal,
		Intervals: r.Intervals, Peak: r.Peak, Violations: r.Violations, Lost: r.Lost, Errors: r.Errors,
		OK: r.OK(), Rows: r.Rows(),
	}, nil
}
