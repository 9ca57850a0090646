package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/guarantee"
	"github.com/sluicehq/sluice/internal/loadgen"
	"github.com/sluicehq/sluice/queue"
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

// Goal of issue 3.
const scaleGoalBytes = 200

const scaleSample = 50 * time.Millisecond

// scale queues callers callers, spread over procs worker processes, on
// one bucket of cfg's limit: each Enters once with deadline d, arriving
// over stagger. The parent samples Redis's memory and the queue's length
// meanwhile.
func scale(ctx context.Context, tg target, cfg bucket.Config, callers, procs int, d, stagger time.Duration, stderr io.Writer) (Scale, error) {
	s := Scale{Callers: callers, Procs: procs, Deadline: d, Stagger: stagger}
	l := guarantee.Limit{Capacity: cfg.Capacity, Amount: cfg.RefillAmount, Every: cfg.RefillFrequency}
	fmt.Fprintf(stderr, "scale: %d callers in %d processes queue once on one bucket (%s/s, burst %d), deadline %v...\n",
		callers, procs, num(float64(l.Amount)/l.Every.Seconds()), l.Capacity, d)
	rdb := client(tg.opt, 2)
	defer rdb.Close()
	prefix := cfg.KeyPrefix
	if prefix == "" {
		prefix = defaultKeyPrefix
	}
	keys := queue.New(nil, prefix, cfg.Name, queue.Options{}).Keys()
	base, err := memory(ctx, rdb)
	if err != nil {
		return s, err
	}

	specs := make([]loadgen.Spec, procs)
	for i := range specs {
		n := callers / procs
		if i < callers%procs {
			n++
		}
		specs[i] = loadgen.Spec{Proc: i, Addr: tg.opt.Addr, URL: tg.url, Bucket: cfg, Callers: n, Enters: 1, Timeout: d, Stagger: stagger}
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
	grants, stats, err := inWorkers(ctx, specs, stderr)
	stopSampling()
	wg.Wait()
	if err != nil {
		return s, err
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
	maxLate := cfg.MaxLateness
	if maxLate == 0 {
		maxLate = defaultMaxLateness
	}
	// Waits are not in steady state here (every caller arrives once):
	// no warm-up is left out.
	s.Saturation = analyse(ok, l, 0, maxLate, stats.RoundTrips)
	s.SetupRoundTrips, s.Steps = stats.SetupRoundTrips, stats.SchedulerSteps
	return s, nil
}

type memSample struct {
	used, clients, conns, queueKey, queued int64
}

// memory reads used_memory and mem_clients_normal from INFO memory, and
// connected_clients from INFO clients.
func memory(ctx context.Context, rdb *redis.Client) (memSample, error) {
	info, err := rdb.Info(ctx, "memory", "clients").Result()
	if err != nil {
		return memSample{}, err
	}
	var m memSample
	var seen int
	for line := range strings.SplitSeq(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		var dst *int64
		switch k {
		case "used_memory":
			dst = &m.used
		case "mem_clients_normal":
			dst = &m.clients
		case "connected_clients":
			dst = &m.conns
		default:
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return m, fmt.Errorf("INFO memory %s: %w", k, err)
		}
		*dst = n
		seen++
	}
	if seen != 3 {
		return m, fmt.Errorf("INFO: used_memory, mem_clients_normal or connected_clients missing")
	}
	return m, nil
}
