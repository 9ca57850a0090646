package semaphore

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// laneLen is the number of waiters in Redis in named lane name.
func laneLen(t *testing.T, s *Semaphore, name string) int64 {
	t.Helper()
	n, err := s.rdb.ZCard(context.Background(), s.lanes+":"+name).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestLanesDefaultLane: the callers that name no lane are a lane of
// weight 1 and priority 0 among the named ones.
func TestLanesDefaultLane(t *testing.T) {
	e := newEnv(t)
	const capacity = 3
	s := e.sem(t, Config{Name: t.Name(), Capacity: capacity, Lanes: []sluice.Lane{{Name: "double", Weight: 2}}})
	gs := runLanes(t, s, 2*time.Second, laneLoad{Callers: 6}, laneLoad{Lane: "double", Callers: 6}, laneLoad{Lane: "single", Callers: 6})
	checkBound(t, gs, capacity)
	from := gs[0].start.Add(500 * time.Millisecond)
	got, total := permitsBetween(gs, from, from.Add(time.Second))
	t.Logf("permits in 1 s: %v (total %d)", got, total)
	checkShares(t, got, total, map[string]float64{"": 0.25, "double": 0.5, "single": 0.25})
	waitFor(t, 2*time.Second, "nothing but the config left", func() bool { return e.stateLeft(t) == 0 })
}

// TestLanesMaxQueue: MaxQueue bounds each lane's waiters.
func TestLanesMaxQueue(t *testing.T) {
	e := newEnv(t)
	s := e.sem(t, Config{Name: t.Name(), Capacity: 1, MaxQueue: 2})
	p := acquire(t, s, time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { s.Acquire(WithLane(ctx, "a")) })
	}
	waitFor(t, time.Second, "two waiters in lane a", func() bool { return laneLen(t, s, "a") == 2 })
	if _, err := s.Acquire(WithLane(ctx, "a")); !errors.Is(err, sluice.ErrQueueFull) {
		t.Fatalf("a third waiter in lane a: %v, want sluice.ErrQueueFull", err)
	}
	wg.Go(func() { s.Acquire(WithLane(ctx, "b")) })
	wg.Go(func() { s.Acquire(ctx) })
	waitFor(t, time.Second, "a waiter in lane b and one in the default lane", func() bool {
		return laneLen(t, s, "b") == 1 && queueLen(t, e.rdb, s) == 1
	})
	cancel()
	wg.Wait()
	releaseGone(t, e.rdb, p)
	waitFor(t, 2*time.Second, "nothing but the config left", func() bool { return e.stateLeft(t) == 0 })
}

// TestLanesDeadWaiters: waiters of a named lane whose process died hold
// up their lane for at most one queue TTL; a live waiter of that lane
// behind them is served, and the lanes' keys go with the last waiter.
func TestLanesDeadWaiters(t *testing.T) {
	e := deadWaiters(t, "t")
	waitFor(t, 2*time.Second, "nothing but the config left", func() bool { return e.stateLeft(t) == 0 })
}

// TestLanesPurgedLiveWaiter: a live waiter of a named lane whose place
// is lost (its keys deleted, as by a restart) gets it back at its next
// refresh and is served.
func TestLanesPurgedLiveWaiter(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	cfg := Config{Name: t.Name(), Capacity: 1, QueueTTL: 600 * time.Millisecond}
	holder, waiter := e.sem(t, cfg), e.sem(t, cfg)
	p := acquire(t, holder, time.Second)
	got := make(chan error, 1)
	go func() {
		q, err := waiter.Acquire(WithLane(ctx, "x"))
		if err == nil {
			q.Release(ctx)
		}
		got <- err
	}()
	waitFor(t, time.Second, "a waiter", func() bool { return laneLen(t, holder, "x") == 1 })
	for _, sfx := range []string{":x", "s", "s:0", "tags", "waits"} {
		k := holder.lanes + sfx
		if err := e.rdb.Del(ctx, k).Err(); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 2*cfg.QueueTTL, "the waiter back in its lane", func() bool { return laneLen(t, holder, "x") == 1 })
	p.Release(ctx)
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * cfg.QueueTTL):
		t.Fatal("purged live waiter never served")
	}
}

// TestLanesLoweredCapacity: SetCapacity refuses the waiters of named
// lanes now heavier than the capacity, and the lighter ones are served.
func TestLanesLoweredCapacity(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	cfg := Config{Name: t.Name(), Capacity: 4}
	s := e.sem(t, cfg)
	holder := acquireN(t, s, 4, time.Second)
	heavy, light := make(chan error, 1), make(chan error, 1)
	go func() {
		_, err := s.AcquireN(WithLane(ctx, "h"), 3)
		heavy <- err
	}()
	go func() {
		q, err := s.AcquireN(WithLane(ctx, "l"), 2)
		if err == nil {
			q.Release(ctx)
		}
		light <- err
	}()
	waitFor(t, time.Second, "both to queue", func() bool { return laneLen(t, s, "h")+laneLen(t, s, "l") == 2 })
	if err := s.SetCapacity(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := <-heavy; !errors.Is(err, sluice.ErrCostExceedsCapacity) {
		t.Fatalf("heavy waiter: %v, want sluice.ErrCostExceedsCapacity", err)
	}
	releaseGone(t, e.rdb, holder)
	if err := <-light; err != nil {
		t.Fatalf("light waiter: %v", err)
	}
	waitFor(t, 2*time.Second, "nothing but the config left", func() bool { return e.stateLeft(t) == 0 })
}

// TestLanesNewcomersDoNotOvertake: with one permit, 50 callers that each
// take a new lane for every call (a new tenant each time, its name
// sorting before "zz") keep the semaphore busy; a caller of lane "zz"
// arriving then is served within two rounds: at most the 50 lanes
// already waiting, the 50 that come before their round ends (their tags
// tie with its own, and ties go by name), and the 2 grants decided before
// its arrival reached Redis pass it. Were a lane that comes later not
// tagged later, the newcomers would tie with it for ever, and win by
// name.
func TestLanesNewcomersDoNotOvertake(t *testing.T) {
	e := newEnv(t)
	s := e.sem(t, Config{Name: t.Name(), Capacity: 1})
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var grants []time.Time
	var seq atomic.Int64
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	const callers = 50
	for range callers {
		wg.Go(func() {
			for {
				p, err := s.Acquire(WithLane(ctx, fmt.Sprintf("a%06d", seq.Add(1))))
				if err != nil {
					return
				}
				mu.Lock()
				grants = append(grants, time.Now())
				mu.Unlock()
				p.Release(ctx)
			}
		})
	}
	waitFor(t, 10*time.Second, "the semaphore busy", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(grants) > 500
	})
	called := time.Now()
	p, err := s.Acquire(WithLane(ctx, "zz"))
	if err != nil {
		t.Fatal(err)
	}
	granted := time.Now()
	p.Release(ctx)
	cancel()
	mu.Lock()
	defer mu.Unlock()
	passed := 0
	for _, g := range grants {
		if g.After(called) && g.Before(granted) {
			passed++
		}
	}
	t.Logf("%d grants passed lane zz (%v)", passed, granted.Sub(called))
	if bound := 2*callers + 2; passed > bound {
		t.Errorf("%d grants passed lane zz, want ≤ %d (two rounds, and the grants decided before its arrival)", passed, bound)
	}
}

// TestLanesInspect: Inspect counts the waiters of every lane, and its
// HeadWeight is that of the waiter the lanes serve next: of the default
// lane's head (weight 2, tag 2) and a named lane's (tag its weight), the
// smaller tag.
func TestLanesInspect(t *testing.T) {
	for _, c := range []struct{ named, head int }{{3, 2}, {1, 1}} {
		e := newEnv(t)
		ctx, cancel := context.WithCancel(context.Background())
		s := e.sem(t, Config{Name: t.Name(), Capacity: 4})
		p := acquireN(t, s, 4, time.Second)
		var wg sync.WaitGroup
		wg.Go(func() { s.AcquireN(ctx, 2) })
		waitFor(t, time.Second, "the default lane's waiter", func() bool { return queueLen(t, e.rdb, s) == 1 })
		wg.Go(func() { s.AcquireN(WithLane(ctx, "x"), c.named) })
		waitFor(t, time.Second, "the named lane's waiter", func() bool { return laneLen(t, s, "x") == 1 })
		in, err := s.Inspect(ctx)
		if err != nil || in.Queued != 2 || in.HeadWeight != c.head || in.Held != 4 || in.Holders != 1 {
			t.Errorf("named waiter of weight %d: Inspect %+v (%v), want 2 queued, head weight %d, 4 held by 1", c.named, in, err, c.head)
		}
		cancel()
		wg.Wait()
		releaseGone(t, e.rdb, p)
	}
}
