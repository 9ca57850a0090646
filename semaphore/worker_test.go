package semaphore

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
)

// Tests that need separate processes re-execute the test binary with
// workerEnv set to a mode; TestMain hands over to runWorker. Workers take
// their settings as JSON in workerConfigEnv and print JSON lines (event) on
// stdout.
const (
	workerEnv       = "SLUICE_SEMAPHORE_WORKER"
	workerConfigEnv = "SLUICE_SEMAPHORE_WORKER_CONFIG"
)

type workerConfig struct {
	Addr       string
	Name       string
	Capacity   int
	LeaseTTL   time.Duration
	QueueTTL   time.Duration
	Goroutines int
	Hold       time.Duration // longest hold (saturate mode), uniform in [0, Hold]
	Duration   time.Duration // how long to run (saturate mode)
	Weight     int           // the permit's weight (hold mode); 0 means 1
	Fallback   bool          // Config.Fallback LocalShare; saturate then runs until stdin closes or Duration
	Lane       string        // the callers' lane (saturate and wait modes); "" the default one
	Lanes      []sluice.Lane // Config.Lanes
}

// event is one line of a worker's output. Times are Unix nanoseconds of
// the machine's wall clock, shared by every process on it.
type event struct {
	Ev         string // "interval", "acquired", "lost", "released", "error", "done"
	G          int    `json:",omitempty"`
	Start, End int64  `json:",omitempty"`
	Lost       bool   `json:",omitempty"`
	T          int64  `json:",omitempty"`
	ValidUntil int64  `json:",omitempty"`
	Err        string `json:",omitempty"`
	// Fallback: an interval's permit came from the local share; "count"
	// events carry the presence count (N), "local" ones the share and the
	// weight held at the switch, "back" the return.
	Local       bool `json:",omitempty"`
	N           int  `json:",omitempty"`
	Share, Held int  `json:",omitempty"`
}

func runWorker(mode string) int {
	var cfg workerConfig
	if err := json.Unmarshal([]byte(os.Getenv(workerConfigEnv)), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "worker config:", err)
		return 2
	}
	rdb := redis.NewClient(&redis.Options{Addr: cfg.Addr, ContextTimeoutEnabled: true, MaxRetries: -1, PoolSize: 4 * max(1, cfg.Goroutines)})
	defer rdb.Close()
	if cfg.Fallback {
		// See fbSem: the first connection before the Hub's probe starts.
		if err := rdb.Ping(context.Background()).Err(); err != nil {
			fmt.Fprintln(os.Stderr, "worker:", err)
			return 2
		}
	}
	var mu sync.Mutex
	enc := json.NewEncoder(os.Stdout)
	emit := func(e event) {
		mu.Lock()
		defer mu.Unlock()
		_ = enc.Encode(e)
	}
	scfg := Config{Name: cfg.Name, Capacity: cfg.Capacity, LeaseTTL: cfg.LeaseTTL, QueueTTL: cfg.QueueTTL, Lanes: cfg.Lanes}
	if cfg.Fallback {
		scfg.Fallback = LocalShare
		scfg.Logger = switchLogger(emit)
	}
	s, err := New(rdb, scfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer s.Close()
	switch mode {
	case "saturate":
		if cfg.Fallback {
			stop := watchCount(s, emit)
			defer stop()
		}
		saturate(s, cfg, emit)
	case "hold":
		hold(s, max(1, cfg.Weight), emit)
	case "wait":
		acquireAndKeep(s, cfg, emit)
	default:
		fmt.Fprintln(os.Stderr, "unknown worker mode", mode)
		return 2
	}
	emit(event{Ev: "done"})
	return 0
}

// saturate runs callers that acquire, hold and release until cfg.Duration
// has passed, and reports every interval. An interval starts when Acquire
// returned and ends before Release is sent, or when the lease was last
// known valid if it was lost: both inside the lease Redis granted.
func saturate(s *Semaphore, cfg workerConfig, emit func(event)) {
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Duration)
	defer cancel()
	if cfg.Lane != "" {
		ctx = WithLane(ctx, cfg.Lane)
	}
	if cfg.Fallback {
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			cancel()
		}()
	}
	var wg sync.WaitGroup
	for g := range cfg.Goroutines {
		wg.Go(func() {
			for ctx.Err() == nil {
				p, err := s.Acquire(ctx)
				if err != nil {
					if ctx.Err() == nil {
						emit(event{Ev: "error", G: g, Err: err.Error()})
					}
					return
				}
				start := time.Now()
				time.Sleep(time.Duration(rand.Int64N(int64(cfg.Hold) + 1)))
				end := time.Now()
				lost := false
				select {
				case <-p.Lost():
					lost = true
					end = earliest(end, p.validUntil())
				default:
				}
				if err := p.Release(context.Background()); err != nil {
					lost = true
					end = earliest(end, p.validUntil())
				}
				emit(event{Ev: "interval", G: g, Start: start.UnixNano(), End: end.UnixNano(), Lost: lost, Local: p.local})
			}
		})
	}
	wg.Wait()
}

// acquireAndKeep runs callers that each acquire a permit (in cfg.Lane),
// keep it, and return.
func acquireAndKeep(s *Semaphore, cfg workerConfig, emit func(event)) {
	ctx := context.Background()
	if cfg.Lane != "" {
		ctx = WithLane(ctx, cfg.Lane)
	}
	var wg sync.WaitGroup
	for g := range cfg.Goroutines {
		wg.Go(func() {
			if _, err := s.Acquire(ctx); err != nil {
				emit(event{Ev: "error", G: g, Err: err.Error()})
			}
		})
	}
	wg.Wait()
}

// hold acquires one permit of weight n and keeps it until the lease is
// lost or stdin closes.
func hold(s *Semaphore, n int, emit func(event)) {
	p, err := s.AcquireN(context.Background(), n)
	if err != nil {
		emit(event{Ev: "error", Err: err.Error()})
		return
	}
	emit(event{Ev: "acquired", T: time.Now().UnixNano(), ValidUntil: p.validUntil().UnixNano()})
	stdin := make(chan struct{})
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		close(stdin)
	}()
	select {
	case <-p.Lost():
		emit(event{Ev: "lost", T: time.Now().UnixNano(), ValidUntil: p.validUntil().UnixNano()})
	case <-stdin:
	}
	e := event{Ev: "released", T: time.Now().UnixNano()}
	if err := p.Release(context.Background()); err != nil {
		e.Err = err.Error()
	}
	emit(e)
}

// worker is a running worker process.
type worker struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	events chan event
	read   sync.WaitGroup
}

func startWorker(t *testing.T, mode string, cfg workerConfig) *worker {
	t.Helper()
	raw, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), workerEnv+"="+mode, workerConfigEnv+"="+string(raw))
	cmd.Stderr = os.Stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w := &worker{cmd: cmd, stdin: stdin, events: make(chan event, 1<<16)}
	w.read.Add(1)
	go func() {
		defer w.read.Done()
		defer close(w.events)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			var e event
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				e = event{Ev: "error", Err: "bad line: " + sc.Text()}
			}
			w.events <- e
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill() // by pid: only the process this test started
		w.read.Wait()
		_ = cmd.Wait()
	})
	return w
}

// next returns the worker's next event, failing t after within.
func (w *worker) next(t *testing.T, within time.Duration) event {
	t.Helper()
	select {
	case e, ok := <-w.events:
		if !ok {
			t.Fatal("worker exited")
		}
		return e
	case <-time.After(within):
		t.Fatalf("no event from worker within %v", within)
	}
	return event{}
}

// all waits for the worker to finish and returns all its events.
func (w *worker) all(t *testing.T, within time.Duration) []event {
	t.Helper()
	var out []event
	timeout := time.After(within)
	for {
		select {
		case e, ok := <-w.events:
			if !ok {
				_ = w.cmd.Wait()
				return out
			}
			out = append(out, e)
		case <-timeout:
			t.Fatalf("worker did not finish within %v", within)
		}
	}
}

type interval struct{ start, end int64 }

// maxOverlap is the largest number of intervals open at one instant, and
// the number of starts that went above capacity. An interval ending at the
// instant another starts does not overlap it.
func maxOverlap(ivs []interval, capacity int) (peak, violations int) {
	type edge struct {
		t int64
		d int
	}
	edges := make([]edge, 0, 2*len(ivs))
	for _, iv := range ivs {
		edges = append(edges, edge{iv.start, +1}, edge{iv.end, -1})
	}
	sort.Slice(edges, func(i, j int) bool {
		if edges[i].t != edges[j].t {
			return edges[i].t < edges[j].t
		}
		return edges[i].d < edges[j].d
	})
	n := 0
	for _, e := range edges {
		n += e.d
		if n > peak {
			peak = n
		}
		if e.d > 0 && n > capacity {
			violations++
		}
	}
	return peak, violations
}

func earliest(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}
