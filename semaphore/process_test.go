package semaphore

import (
	"context"
	"syscall"
	"testing"
	"time"
)

// TestBoundAcrossProcesses saturates one semaphore from several processes
// and checks every (acquire, release) interval: never more than Capacity
// at once, and every caller served.
func TestBoundAcrossProcesses(t *testing.T) {
	e := newEnv(t)
	e.srv.RequireReal(t)
	const procs, goroutines, capacity = 4, 6, 3
	cfg := workerConfig{
		Addr: e.srv.Addr(), Name: t.Name(), Capacity: capacity,
		LeaseTTL: 2 * time.Second, QueueTTL: time.Second,
		Goroutines: goroutines, Hold: 2 * time.Millisecond, Duration: 1500 * time.Millisecond,
	}
	var workers []*worker
	for range procs {
		workers = append(workers, startWorker(t, "saturate", cfg))
	}
	var ivs []interval
	perCaller := map[[2]int]int{}
	for i, w := range workers {
		for _, ev := range w.all(t, 20*time.Second) {
			switch ev.Ev {
			case "interval":
				ivs = append(ivs, interval{ev.Start, ev.End})
				perCaller[[2]int{i, ev.G}]++
				if ev.Lost {
					t.Errorf("worker %d caller %d lost a lease in a healthy run", i, ev.G)
				}
			case "error":
				t.Errorf("worker %d: %s", i, ev.Err)
			}
		}
	}
	peak, violations := maxOverlap(ivs, capacity)
	lo, hi := len(ivs), 0
	for _, n := range perCaller {
		lo, hi = min(lo, n), max(hi, n)
	}
	t.Logf("%d intervals from %d callers in %d processes; peak %d of %d; per caller %d..%d", len(ivs), len(perCaller), procs, peak, capacity, lo, hi)
	if violations > 0 {
		t.Fatalf("%d acquisitions above capacity %d (peak %d)", violations, capacity, peak)
	}
	if len(perCaller) != procs*goroutines {
		t.Fatalf("only %d of %d callers were ever served", len(perCaller), procs*goroutines)
	}
	if peak != capacity {
		t.Fatalf("peak %d: the run never saturated capacity %d", peak, capacity)
	}
}

// TestHolderKilled: a holder's process dies; its place is handed on within
// one lease TTL of the kill.
func TestHolderKilled(t *testing.T) {
	e := newEnv(t)
	e.srv.RequireReal(t)
	const lease = 500 * time.Millisecond
	cfg := workerConfig{Addr: e.srv.Addr(), Name: t.Name(), Capacity: 1, LeaseTTL: lease, QueueTTL: lease}
	w := startWorker(t, "hold", cfg)
	if ev := w.next(t, 5*time.Second); ev.Ev != "acquired" {
		t.Fatalf("worker: %+v", ev)
	}
	s := e.sem(t, Config{Name: t.Name(), Capacity: 1, LeaseTTL: lease, QueueTTL: lease})
	got := make(chan time.Time, 1)
	go func() {
		p, err := s.Acquire(context.Background())
		if err == nil {
			got <- time.Now()
			p.Release(context.Background())
		}
		close(got)
	}()
	waitFor(t, time.Second, "the parent to queue", func() bool { return queueLen(t, e.rdb, s) == 1 })
	if err := w.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	select {
	case at, ok := <-got:
		if !ok {
			t.Fatal("Acquire failed")
		}
		recovery := at.Sub(killed)
		t.Logf("place recovered %v after SIGKILL (lease TTL %v)", recovery, lease)
		// Timer and scheduling slack on a loaded 2-core machine.
		if recovery > lease+50*time.Millisecond {
			t.Fatalf("recovered after %v, want within the lease TTL %v", recovery, lease)
		}
	case <-time.After(5 * lease):
		t.Fatal("place never recovered")
	}
}

// TestHolderFrozen: a holder frozen past its lease loses it, another
// caller gets the place, and the thawed holder learns its lease is gone;
// its last valid instant precedes the new holder's start.
func TestHolderFrozen(t *testing.T) {
	e := newEnv(t)
	e.srv.RequireReal(t)
	const lease = 400 * time.Millisecond
	cfg := workerConfig{Addr: e.srv.Addr(), Name: t.Name(), Capacity: 1, LeaseTTL: lease, QueueTTL: lease}
	w := startWorker(t, "hold", cfg)
	if ev := w.next(t, 5*time.Second); ev.Ev != "acquired" {
		t.Fatalf("worker: %+v", ev)
	}
	if err := w.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer w.cmd.Process.Signal(syscall.SIGCONT)
	s := e.sem(t, Config{Name: t.Name(), Capacity: 1, LeaseTTL: lease, QueueTTL: lease})
	p := acquire(t, s, 5*lease)
	started := time.Now()
	if err := w.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	ev := w.next(t, 5*lease)
	if ev.Ev != "lost" {
		t.Fatalf("thawed worker reported %+v, want lost", ev)
	}
	validUntil := time.Unix(0, ev.ValidUntil)
	t.Logf("frozen holder's lease valid until %v before the new holder started; it learned %v after thaw",
		started.Sub(validUntil), time.Unix(0, ev.T).Sub(started))
	if !validUntil.Before(started) {
		t.Fatalf("the frozen holder's lease ran until %v after the new holder started", validUntil.Sub(started))
	}
	if ev := w.next(t, 5*lease); ev.Ev != "released" || ev.Err != ErrLeaseLost.Error() {
		t.Fatalf("worker's Release after the loss: %+v, want %v", ev, ErrLeaseLost)
	}
	// The thawed holder's release freed nothing: the place is still ours.
	select {
	case <-p.Lost():
		t.Fatal("the new holder lost its lease")
	default:
	}
	other := e.sem(t, Config{Name: t.Name(), Capacity: 1, LeaseTTL: lease, QueueTTL: lease})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if _, err := other.Acquire(ctx); err == nil {
		t.Fatal("a second holder got in: capacity 1 exceeded")
	}
	if err := p.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestDeadWaiters: waiters whose process died hold up the queue for at most
// one queue TTL in all (not one per dead waiter).
func TestDeadWaiters(t *testing.T) { deadWaiters(t, "") }

// deadWaiters: 5 waiters of lane ("" the default) whose process died
// hold it up for at most one queue TTL in all; a live waiter of the lane
// behind them, of another handle, is served. It returns the env.
func deadWaiters(t *testing.T, lane string) *env {
	e := newEnv(t)
	e.srv.RequireReal(t)
	const qttl = 600 * time.Millisecond
	cfg := Config{Name: t.Name(), Capacity: 1, LeaseTTL: 2 * time.Second, QueueTTL: qttl}
	s := e.sem(t, cfg)
	queued := func() int64 {
		if lane == "" {
			return queueLen(t, e.rdb, s)
		}
		return laneLen(t, s, lane)
	}
	p := acquire(t, s, time.Second)
	w := startWorker(t, "wait", workerConfig{Addr: e.srv.Addr(), Name: cfg.Name, Capacity: 1, LeaseTTL: cfg.LeaseTTL, QueueTTL: qttl, Goroutines: 5, Lane: lane})
	waitFor(t, 5*time.Second, "5 dead-to-be waiters", func() bool { return queued() == 5 })
	live := e.sem(t, cfg)
	got := make(chan time.Time, 1)
	go func() {
		ctx := context.Background()
		if lane != "" {
			ctx = WithLane(ctx, lane)
		}
		p, err := live.Acquire(ctx)
		if err == nil {
			got <- time.Now()
			p.Release(context.Background())
		}
		close(got)
	}()
	waitFor(t, time.Second, "the live waiter to queue", func() bool { return queued() == 6 })
	if err := w.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	if err := p.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case at, ok := <-got:
		if !ok {
			t.Fatal("live Acquire failed")
		}
		d := at.Sub(released)
		t.Logf("live waiter behind 5 dead ones served %v after the release (queue TTL %v)", d, qttl)
		if d > qttl+100*time.Millisecond {
			t.Fatalf("served after %v, want within one queue TTL %v", d, qttl)
		}
	case <-time.After(10 * qttl):
		t.Fatal("live waiter never served")
	}
	return e
}
