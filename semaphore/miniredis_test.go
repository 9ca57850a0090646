package semaphore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/testing/testkit"
	"github.com/sluicehq/sluice/semaphore"
)

// The semaphore's contract on miniredis, the in-process server a user's
// unit tests run on, whether or not redis-server is installed: the scripts
// and the Go side that reads their replies must work on both servers.

// newMiniSem opens a semaphore of cfg (named after the test) on its own
// client of mr, as another process would, and closes both at cleanup.
func newMiniSem(t *testing.T, mr *miniredis.Miniredis, cfg semaphore.Config) *semaphore.Semaphore {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = t.Name()
	}
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	s, err := semaphore.New(rdb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		rdb.Close()
	})
	return s
}

// inspect reads s's state across every process, failing t on an error.
func inspect(t *testing.T, s *semaphore.Semaphore) semaphore.Inspection {
	t.Helper()
	in, err := s.Inspect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return in
}

// TestMiniredisAcquire: on miniredis, callers of two processes' handles
// never hold more than the capacity at once, and every one gets its
// permits; once all are released nothing is held.
func TestMiniredisAcquire(t *testing.T) {
	mr := miniredis.RunT(t)
	cfg := semaphore.Config{Capacity: 3}
	sems := []*semaphore.Semaphore{newMiniSem(t, mr, cfg), newMiniSem(t, mr, cfg)}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a bound on a hang
	defer cancel()

	const callers, each = 8, 3
	var holding, peak, granted atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, callers*each)
	for c := range callers {
		s := sems[c%len(sems)]
		wg.Go(func() {
			for range each {
				p, err := s.Acquire(ctx)
				if err != nil {
					errs <- err
					return
				}
				n := holding.Add(1)
				for m := peak.Load(); n > m && !peak.CompareAndSwap(m, n); m = peak.Load() {
				}
				granted.Add(1)
				time.Sleep(2 * time.Millisecond) // the work: others queue meanwhile
				holding.Add(-1)
				if err := p.Release(ctx); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("a caller failed: %v", err)
	}
	if granted.Load() != callers*each || peak.Load() > int32(cfg.Capacity) {
		t.Errorf("%d permits granted, at most %d held at once; want %d, at most the capacity %d", granted.Load(), peak.Load(), callers*each, cfg.Capacity)
	}
	for _, s := range sems {
		if in := inspect(t, s); in.Held != 0 || in.Queued != 0 || in.Capacity != cfg.Capacity {
			t.Errorf("after every release: %+v; want nothing held or queued, capacity %d", in, cfg.Capacity)
		}
	}
}

// TestMiniredisOrder: on miniredis, waiters of a full semaphore are served
// in arrival order, each only when a place is free; a caller whose ctx
// ends while it waits gives its place up.
func TestMiniredisOrder(t *testing.T) {
	mr := miniredis.RunT(t)
	cfg := semaphore.Config{Capacity: 1}
	s, other := newMiniSem(t, mr, cfg), newMiniSem(t, mr, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a bound on a hang
	defer cancel()

	held, err := s.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		who string
		p   *semaphore.Permit
		err error
	}
	got := make(chan result, 2)
	arrive := func(who string, sem *semaphore.Semaphore, queued int) {
		go func() {
			p, err := sem.Acquire(ctx)
			got <- result{who, p, err}
		}()
		testkit.WaitFor(t, 10*time.Second, who+" queued", func() bool { return inspect(t, s).Queued == queued })
	}
	arrive("first", other, 1)
	arrive("second", s, 2)

	// A third caller gives up: its place goes, the others keep theirs.
	short, stop := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = other.Acquire(short)
	stop()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Acquire of a full semaphore with 200ms to live: %v; want context.DeadlineExceeded", err)
	}
	testkit.WaitFor(t, 10*time.Second, "the caller that gave up gone", func() bool { return inspect(t, s).Queued == 2 })

	for _, want := range []string{"first", "second"} {
		if err := held.Release(ctx); err != nil {
			t.Fatal(err)
		}
		var r result
		select {
		case r = <-got:
		case <-ctx.Done():
			t.Fatalf("%s waiter not granted after a release", want)
		}
		if r.err != nil || r.who != want {
			t.Fatalf("granted %s (%v); want %s, in arrival order", r.who, r.err, want)
		}
		if in := inspect(t, s); in.Held != 1 {
			t.Errorf("with %s granted: %d held; want 1, the capacity", want, in.Held)
		}
		held = r.p
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestMiniredisRefusals: on miniredis, a weight above the capacity is
// refused with sluice.ErrCostExceedsCapacity, and a process whose capacity
// differs from the one in force with sluice.ErrConfigMismatch.
func TestMiniredisRefusals(t *testing.T) {
	mr := miniredis.RunT(t)
	s := newMiniSem(t, mr, semaphore.Config{Capacity: 3})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a bound on a hang
	defer cancel()
	p, err := s.AcquireN(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := s.AcquireN(ctx, 4); !errors.Is(err, sluice.ErrCostExceedsCapacity) {
		t.Errorf("AcquireN(4) of capacity 3: %v; want sluice.ErrCostExceedsCapacity", err)
	}
	other := newMiniSem(t, mr, semaphore.Config{Capacity: 2})
	_, err = other.Acquire(ctx)
	var mismatch *sluice.ConfigMismatchError
	if !errors.Is(err, sluice.ErrConfigMismatch) || !errors.As(err, &mismatch) || mismatch.Limiter != "semaphore" {
		t.Errorf("Acquire with capacity 2 where 3 is in force: %v; want a *sluice.ConfigMismatchError", err)
	}
}

// TestMiniredisLanes: on miniredis, lanes decide the order: a waiter of
// a higher priority goes before those of the default priority that came
// first, and two lanes of equal weight alternate.
func TestMiniredisLanes(t *testing.T) {
	mr := miniredis.RunT(t)
	s := newMiniSem(t, mr, semaphore.Config{Capacity: 1, Lanes: []sluice.Lane{{Name: "interactive", Priority: 1}}})
	ctx := context.Background()
	held, err := s.Acquire(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	for i, who := range []string{"b1", "b2", "a1", "a2", "interactive"} {
		lane := who
		if who != "interactive" {
			lane = who[:1]
		}
		wg.Go(func() {
			p, err := s.Acquire(semaphore.WithLane(ctx, lane))
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, who)
			mu.Unlock()
			p.Release(ctx)
		})
		testkit.WaitFor(t, time.Second, who+" queued", func() bool { return inspect(t, s).Queued == i+1 })
	}
	held.Release(ctx)
	wg.Wait()
	if want := "[interactive a1 b1 a2 b2]"; fmt.Sprint(order) != want {
		t.Errorf("served %v, want %s", order, want)
	}
}
