package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
)

// Scale is many callers queued at once on one bucket, across worker
// processes: what a waiting caller costs Redis, and whether the queue
// still behaves.
type Scale struct {
	Callers  int           `json:"callers"`
	Procs    int           `json:"procs"`
	Deadline time.Duration `json:"deadline_ns"` // each caller Enters once with this deadline
	Stagger  time.Duration `json:"stagger_ns"`  // arrivals spread over this long

	// The sample taken when the most callers were queued (LLEN of the
	// queue key, sampled every scaleSample).
	QueuedPeak     int64   `json:"queued_peak"`
	UsedMemory     int64   `json:"used_memory_delta"`      // INFO used_memory, minus the value before the workers started
	ClientMemory   int64   `json:"client_memory_delta"`    // INFO mem_clients_normal, likewise: connections' buffers
	Connections    int64   `json:"connections_delta"`      // INFO connected_clients, likewise
	QueueKeyMemory int64   `json:"queue_key_memory"`       // MEMORY USAGE of the queue key (SAMPLES 0)
	PerWaiter      float64 `json:"bytes_per_waiter"`       // UsedMemory / QueuedPeak
	PerWaiterData  float64 `json:"bytes_per_waiter_data"`  // (UsedMemory − ClientMemory) / QueuedPeak
	PerWaiterQueue float64 `json:"bytes_per_waiter_queue"` // QueueKeyMemory / QueuedPeak
	Samples        int     `json:"samples"`

	Deadlines int     `json:"deadlines"`        // callers that left at their deadline
	Polls     int     `json:"polls"`            // by every caller, granted or not
	PollsPer  float64 `json:"polls_per_caller"` // Polls / Callers
	Saturation
	SetupRoundTrips int64 `json:"setup_round_trips"`
	Steps           int64 `json:"scheduler_steps"`
}

// scaleGoalBytes is the goal for Redis memory per waiting caller.
const scaleGoalBytes = 200

const scaleSample = 50 * time.Millisecond

func (*Scale) about() about {
	return about{name: "scale", takes: "~7 s",
		what:  "10,000 callers in 8 processes queue once on one bucket: Redis memory per waiting caller, polls, the guarantee",
		needs: "it measures Redis's memory per waiting caller (INFO memory), which miniredis does not report"}
}

func (s *Scale) flags(fs *flag.FlagSet) {
	fs.IntVar(&s.Callers, "scale-callers", 10000, "callers queued once, spread over the processes")
	fs.IntVar(&s.Procs, "scale-procs", 8, "worker processes")
	fs.DurationVar(&s.Deadline, "scale-deadline", 5*time.Second, "each caller's deadline for its one Enter")
	fs.DurationVar(&s.Stagger, "scale-stagger", time.Second, "the callers' arrivals are spread over this long")
}

func (s *Scale) check() error {
	switch {
	case s.Procs < 1 || s.Procs > s.Callers:
		return fmt.Errorf("--scale-procs %d: want between 1 and --scale-callers (%d)", s.Procs, s.Callers)
	case s.Deadline <= 0 || s.Stagger < 0:
		return fmt.Errorf("--scale-deadline %v, --scale-stagger %v: want > 0 and ≥ 0", s.Deadline, s.Stagger)
	}
	return nil
}

// run queues s.Callers callers, spread over s.Procs worker processes, on
// one bucket of the limit: each Enters once with deadline s.Deadline,
// arriving over s.Stagger. This process samples Redis's memory and the
// queue's length meanwhile.
func (s *Scale) run(ctx context.Context, e *env) error {
	tg, callers, procs, d, stagger := e.target, s.Callers, s.Procs, s.Deadline, s.Stagger
	cfg := e.limit
	cfg.Name = e.name
	l := guarantee.Limit{Capacity: cfg.Capacity, RefillAmount: cfg.RefillAmount, RefillFrequency: cfg.RefillFrequency}
	e.logf("scale: %d callers in %d processes queue once on one bucket (%s/s, burst %d), deadline %v...",
		callers, procs, num(float64(l.RefillAmount)/l.RefillFrequency.Seconds()), l.Capacity, d)
	rdb := client(tg.opt, 2)
	defer rdb.Close()
	prefix := cfg.KeyPrefix
	if prefix == "" {
		prefix = defaultKeyPrefix
	}
	keys := queueio.NewKeys(prefix, cfg.Name)
	base, err := memory(ctx, rdb)
	if err != nil {
		return err
	}

	specs := make([]loadgen.Spec, procs)
	for i := range specs {
		specs[i] = loadgen.Spec{Proc: i, Addr: tg.opt.Addr, URL: tg.url, Bucket: cfg, Callers: share(callers, procs, i), Enters: 1, Timeout: d, Stagger: stagger}
	}
	sampleCtx, stopSampling := context.WithCancel(ctx)
	var peak memSample
	var rising []memSample
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(scaleSample)
		defer t.Stop()
		for {
			select {
			case <-sampleCtx.Done():
				return
			case <-t.C:
			}
			n, err := rdb.LLen(sampleCtx, keys.Queue).Result()
			if err != nil || n <= peak.queued {
				continue
			}
			m, err := memory(sampleCtx, rdb)
			if err != nil {
				continue
			}
			m.queued = n
			m.queueKey, _ = rdb.MemoryUsage(sampleCtx, keys.Queue, 0).Result()
			peak = m
			rising = append(rising, m)
		}
	})
	grants, stats, err := inWorkers(ctx, specs, e.log)
	stopSampling()
	wg.Wait()
	if err != nil {
		return err
	}
	s.QueuedPeak = peak.queued
	s.UsedMemory = peak.used - base.used
	s.ClientMemory = peak.clients - base.clients
	s.Connections = peak.conns - base.conns
	s.QueueKeyMemory = peak.queueKey
	s.Samples = len(rising)
	if s.QueuedPeak > 0 {
		s.PerWaiter = float64(s.UsedMemory) / float64(s.QueuedPeak)
		s.PerWaiterData = float64(s.UsedMemory-s.ClientMemory) / float64(s.QueuedPeak)
		s.PerWaiterQueue = float64(s.QueueKeyMemory) / float64(s.QueuedPeak)
	}
	var ok []loadgen.Grant
	for _, g := range grants {
		s.Polls += g.Polls
		if !g.OK() && strings.Contains(g.Err, context.DeadlineExceeded.Error()) {
			s.Deadlines++
			continue
		}
		ok = append(ok, g)
	}
	s.PollsPer = per(int64(s.Polls), len(grants))
	maxLate := cmp.Or(cfg.MaxLateness, defaultMaxLateness)
	// Waits are not in steady state here (every caller arrives once):
	// no warm-up is left out.
	s.Saturation = analyse(ok, l, 0, maxLate, stats.RoundTrips)
	s.SetupRoundTrips, s.Steps = stats.SetupRoundTrips, stats.SchedulerSteps
	return nil
}

func (s *Scale) table(t *table, _ Limit) {
	t.title("SCALE: %s callers in %d processes Enter once on one bucket, arriving over %v, deadline %v",
		commas(s.Callers), s.Procs, s.Stagger, s.Deadline)
	row := func(name, v, note string) { t.row(name, v, note) }
	row("callers queued at the peak", commas(int(s.QueuedPeak)), fmt.Sprintf("LLEN of the queue key, sampled every %v (%d samples as it grew)", scaleSample, s.Samples))
	row("Redis memory per waiting caller", fmt.Sprintf("%.0f B", s.PerWaiter), fmt.Sprintf("%s; INFO used_memory Δ %s B / queued", t.goal(s.PerWaiter <= scaleGoalBytes, fmt.Sprintf("≤ %d B", scaleGoalBytes)), commas(int(s.UsedMemory))))
	row("  less connection buffers", fmt.Sprintf("%.0f B", s.PerWaiterData), fmt.Sprintf("(used_memory Δ − mem_clients_normal Δ %s B of %d more connections) / queued", commas(int(s.ClientMemory)), s.Connections))
	row("  the queue key alone", fmt.Sprintf("%.0f B", s.PerWaiterQueue), fmt.Sprintf("MEMORY USAGE %s B / queued", commas(int(s.QueueKeyMemory))))
	note := fmt.Sprintf("%s left at their deadline; %d errors", commas(s.Deadlines), s.Errors)
	if s.Err != "" {
		note += "; first: " + s.Err
	}
	row("grants", commas(s.Grants), note)
	s.Saturation.limitRows(row)
	row("utilization", fmt.Sprintf("%.2f %%", 100*s.Throughput.Utilization), fmt.Sprintf("rate after the initial burst %s/s", num(s.Throughput.Rate)))
	row("grants overtaken, by grant time", pct(s.OvertakenSlot, s.Grants), fmt.Sprintf("%d callers granted later than one that reached Redis after them", s.OvertakenSlot))
	row("polls per queued caller (granted)", fmt.Sprintf("%.3f", s.PollsPerQueued), fmt.Sprintf("%s queued grants; max %d polls", commas(s.Queued), s.MaxPolls))
	row("polls per caller (all)", fmt.Sprintf("%.3f", s.PollsPer), fmt.Sprintf("%s polls by %s callers, those that left included", commas(s.Polls), commas(s.Callers)))
	row("round trips per grant, all", fmt.Sprintf("%.3f", s.RoundTripsPerGrant()), fmt.Sprintf("%s sent by all processes (cancellations included); handshakes (%s) left out", commas(int(s.RoundTrips)), commas(int(s.SetupRoundTrips))))
	row("round trips per caller, all", fmt.Sprintf("%.3f", per(s.RoundTrips, s.Callers)), fmt.Sprintf("scheduler steps %s", commas(int(s.Steps))))
	row("wait of queued grants p50 / p99 / max", fmt.Sprintf("%s / %s / %s", dur(s.Wait.P50), dur(s.Wait.P99), dur(s.Wait.Max)), "every caller arrives once: no steady state")
	row("lateness p50 / p99 / max", fmt.Sprintf("%s / %s / %s", dur(s.Late.P50), dur(s.Late.P99), dur(s.Late.Max)), fmt.Sprintf("after the grant time; %d returned > MaxLateness after it, %d late callers took the next grant time (retimes), %d queued again (re-entries)", s.Tardy, s.Retimes, s.Reentries))
}

func (s *Scale) gobench(g *gobench) {
	g.line("Scale", s.Callers, s.QueuedPeak, "queued", f(s.PerWaiter), "B/waiter", f(s.PerWaiterData), "B/waiter-data",
		f(s.PerWaiterQueue), "B/waiter-queue-key", s.ExcessSlots.All, "excess-slots", s.ExcessStarts.All, "excess-starts",
		f(s.PollsPerQueued), "polls/waiter", f(s.PollsPer), "polls/caller", f(s.RoundTripsPerGrant()), "round-trips/op",
		f(per(s.RoundTrips, s.Callers)), "round-trips/caller", s.Grants, "grants", s.Deadlines, "deadlines", s.Errors, "errors")
}

type memSample struct {
	used, clients, conns, queueKey, queued int64
}

// memory reads used_memory and mem_clients_normal from INFO memory, and
// connected_clients from INFO clients.
func memory(ctx context.Context, rdb *redis.Client) (memSample, error) {
	info, err := rdb.InfoMap(ctx, "memory", "clients").Result()
	if err != nil {
		return memSample{}, err
	}
	var m memSample
	for _, f := range []struct {
		dst     *int64
		section string
		key     string
	}{{&m.used, "Memory", "used_memory"}, {&m.clients, "Memory", "mem_clients_normal"}, {&m.conns, "Clients", "connected_clients"}} {
		if *f.dst, err = strconv.ParseInt(info[f.section][f.key], 10, 64); err != nil {
			return m, fmt.Errorf("INFO %s %s: %w", f.section, f.key, err)
		}
	}
	return m, nil
}
