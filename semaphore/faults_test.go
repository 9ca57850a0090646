package semaphore

import (
	"context"
	"errors"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
)

// TestFIFOAcrossProcesses: waiters from different Semaphores (each with its
// own client and process id, as separate processes would be) are served in
// the order they reached Redis.
func TestFIFOAcrossProcesses(t *testing.T) {
	e := newEnv(t)
	cfg := Config{Name: t.Name(), Capacity: 1}
	holder := e.sem(t, cfg)
	first := acquire(t, holder, time.Second)
	const n = 8
	sems := make([]*Semaphore, 3)
	for i := range sems {
		sems[i] = e.sem(t, cfg)
	}
	var mu sync.Mutex
	var order []int
	var wg sync.WaitGroup
	for i := range n {
		s := sems[(i*7)%len(sems)] // interleave the processes
		wg.Go(func() {
			p, err := s.Acquire(context.Background())
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			p.Release(context.Background())
		})
		waitFor(t, time.Second, "waiter to queue", func() bool { return queueLen(t, e.rdb, holder) == int64(i+1) })
	}
	if err := first.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	for i, got := range order {
		if got != i {
			t.Fatalf("served in order %v, want arrival order", order)
		}
	}
}

func TestMaxQueue(t *testing.T) {
	e := newEnv(t)
	s := e.sem(t, Config{Name: t.Name(), Capacity: 1, MaxQueue: 2})
	p := acquire(t, s, time.Second)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { s.Acquire(ctx) })
	}
	waitFor(t, time.Second, "two waiters", func() bool { return queueLen(t, e.rdb, s) == 2 })
	_, err := s.Acquire(context.Background())
	if !errors.Is(err, sluice.ErrQueueFull) || !errors.Is(err, sluice.ErrLimited) {
		t.Fatalf("Acquire on a full queue: %v, want sluice.ErrQueueFull wrapping sluice.ErrLimited", err)
	}
	cancel()
	wg.Wait()
	p.Release(context.Background())
}

// TestNamesIsolated: names that escape alike in naive schemes do not share
// places.
func TestNamesIsolated(t *testing.T) {
	e := newEnv(t)
	var permits []*Permit
	for _, name := range []string{"a{b}", "a%7Bb%7D", "a", "{a}"} {
		s := e.sem(t, Config{Name: name, Capacity: 1})
		permits = append(permits, acquire(t, s, time.Second))
	}
	for _, p := range permits {
		if err := p.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

// TestKeyTTLs: every key outlives every lease in it, and Lua kept the µs
// epoch scores exact.
func TestKeyTTLs(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.sem(t, Config{Name: t.Name(), Capacity: 1, LeaseTTL: 3 * time.Second, QueueTTL: time.Second})
	p := acquire(t, s, time.Second)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { s.Acquire(wctx); close(done) }()
	waitFor(t, time.Second, "a waiter", func() bool { return queueLen(t, e.rdb, s) == 1 })
	// The leases first, then Redis's now: a lease renewed between the two
	// reads ends 3 s after a now earlier than the one read, never later.
	zs, err := e.rdb.ZRangeWithScores(ctx, s.keys[0], 0, -1).Result()
	if err != nil || len(zs) != 2 {
		t.Fatalf("leases: %v %v, want the holder's and the waiter's", zs, err)
	}
	now, err := e.rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	nowUS := now.UnixMicro()
	for _, z := range zs {
		left := time.Duration(int64(z.Score)-nowUS) * time.Microsecond
		if left <= 0 || left > 3*time.Second {
			t.Fatalf("lease ends %v from Redis now: corrupt µs score %v", left, z.Score)
		}
	}
	for _, k := range s.keys[:3] { // the weights hash exists only for weights above 1
		ttl, err := e.rdb.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		// The permit's lease is 3s; every key must outlive it.
		if ttl < 3*time.Second {
			t.Errorf("%s: TTL %v, want beyond the 3s lease", k, ttl)
		}
	}
	cancel()
	<-done
	p.Release(ctx)
	waitFor(t, time.Second, "nothing but the config left", func() bool { return e.stateLeft(t) == 0 })
}

// TestDoubleRelease: a second release, or one after the lease was lost, is
// harmless and frees nobody else's place.
func TestDoubleRelease(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	cfg := Config{Name: t.Name(), Capacity: 1, LeaseTTL: 300 * time.Millisecond}
	s := e.sem(t, cfg)
	p1 := acquire(t, s, time.Second)
	if err := p1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p1.Release(ctx); err != nil {
		t.Fatalf("second Release: %v, want nil", err)
	}
	p2 := acquire(t, s, time.Second)
	if err := p1.Release(ctx); err != nil {
		t.Fatalf("third Release: %v", err)
	}
	if n := holdersLen(t, e.rdb, s); n != 1 {
		t.Fatalf("%d holders after p1's extra releases, want p2 alone", n)
	}

	// p2's lease vanishes from Redis (as if it expired while its process
	// stalled); another process takes the place.
	if err := e.rdb.ZRem(ctx, s.keys[0], p2.id).Err(); err != nil {
		t.Fatal(err)
	}
	other := e.sem(t, cfg)
	p3 := acquire(t, other, time.Second)
	select {
	case <-p2.Lost():
	case <-time.After(2 * cfg.LeaseTTL):
		t.Fatal("p2 never learned its lease was lost")
	}
	if err := p2.Release(ctx); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Release of a lost permit: %v, want ErrLeaseLost", err)
	}
	if err := p2.Release(ctx); err != nil {
		t.Fatalf("second Release of a lost permit: %v, want nil", err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := s.Acquire(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire while p3 holds: %v, want deadline exceeded", err)
	}
	if err := p3.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestClose(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.sem(t, Config{Name: t.Name(), Capacity: 1})
	p := acquire(t, s, time.Second)
	waited := make(chan error, 1)
	go func() {
		_, err := s.Acquire(ctx)
		waited <- err
	}()
	waitFor(t, time.Second, "a waiter", func() bool { return queueLen(t, e.rdb, s) == 1 })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-waited; !errors.Is(err, sluice.ErrClosed) {
		t.Fatalf("waiting Acquire at Close: %v, want sluice.ErrClosed", err)
	}
	select {
	case <-p.Lost():
	default:
		t.Fatal("held permit not marked lost at Close")
	}
	if _, err := s.Acquire(ctx); !errors.Is(err, sluice.ErrClosed) {
		t.Fatalf("Acquire after Close: %v, want sluice.ErrClosed", err)
	}
	if err := s.Do(ctx, func(context.Context) error { return nil }); !errors.Is(err, sluice.ErrClosed) {
		t.Fatalf("Do after Close: %v, want sluice.ErrClosed", err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if n := e.stateLeft(t); n != 0 {
		t.Fatalf("%d keys besides the config left after Close gave everything back", n)
	}
}

// TestReleaseThenClose: Release returns before Redis has the release;
// Close sends every release still pending, so a process that releases and
// closes at once leaves no permit behind.
func TestReleaseThenClose(t *testing.T) {
	e := newEnv(t)
	s := e.sem(t, Config{Name: t.Name(), Capacity: 50})
	acquireReleaseAll(t, s, 50)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if n := e.stateLeft(t); n != 0 {
		t.Fatalf("%d keys besides the config left after 50 releases and Close", n)
	}
}

// TestCancellationStorm: many waiters give up; nothing of them stays in
// Redis or in the process, and the capacity is intact.
func TestCancellationStorm(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	cfg := Config{Name: t.Name(), Capacity: 2}
	holder := e.sem(t, cfg)
	s := e.sem(t, cfg)
	held := []*Permit{acquire(t, holder, time.Second), acquire(t, holder, time.Second)}
	var wg sync.WaitGroup
	for range 200 {
		wg.Go(func() {
			c, cancel := context.WithTimeout(ctx, time.Duration(rand.IntN(30_000))*time.Microsecond)
			defer cancel()
			if _, err := s.Acquire(c); !errors.Is(err, c.Err()) || err == nil {
				t.Errorf("Acquire: %v, want the context's error", err)
			}
		})
	}
	wg.Wait()
	waitFor(t, 2*time.Second, "an empty queue", func() bool { return queueLen(t, e.rdb, s) == 0 })
	s.mu.Lock()
	left := len(s.waiters) + len(s.pendAcquire)
	s.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d waiters left in the process", left)
	}
	for _, p := range held {
		p.Release(ctx)
	}
	a, b := acquire(t, s, time.Second), acquire(t, s, time.Second)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := s.Acquire(short); err == nil {
		t.Fatal("a third permit on capacity 2")
	}
	a.Release(ctx)
	b.Release(ctx)

	// Now cancellations racing with grants: in-process concurrency never
	// exceeds capacity, and everything is given back.
	var inside, peak atomic.Int64
	for range 40 {
		wg.Go(func() {
			for range 25 {
				c, cancel := context.WithTimeout(ctx, time.Duration(rand.IntN(3000))*time.Microsecond)
				p, err := s.Acquire(c)
				cancel()
				if err != nil {
					continue
				}
				n := inside.Add(1)
				for {
					old := peak.Load()
					if n <= old || peak.CompareAndSwap(old, n) {
						break
					}
				}
				time.Sleep(time.Duration(rand.IntN(500)) * time.Microsecond)
				inside.Add(-1)
				p.Release(ctx)
			}
		})
	}
	wg.Wait()
	if peak.Load() > 2 {
		t.Fatalf("%d holders at once on capacity 2", peak.Load())
	}
	waitFor(t, 2*time.Second, "nothing but the config left", func() bool { return e.stateLeft(t) == 0 })
}

// TestLostWakeup: notifications lost with the pub/sub connections do not
// strand a waiter; the poll finds its grant.
func TestLostWakeup(t *testing.T) {
	e := newEnv(t)
	e.srv.RequireReal(t) // CLIENT KILL
	ctx := context.Background()
	cfg := Config{Name: t.Name(), Capacity: 1, QueueTTL: 600 * time.Millisecond}
	holder, waiter := e.sem(t, cfg), e.sem(t, cfg)
	p := acquire(t, holder, time.Second)
	got := make(chan error, 1)
	go func() {
		q, err := waiter.Acquire(ctx)
		if err == nil {
			q.Release(ctx)
		}
		got <- err
	}()
	waitFor(t, time.Second, "a waiter", func() bool { return queueLen(t, e.rdb, holder) == 1 })
	if err := e.rdb.Do(ctx, "CLIENT", "KILL", "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	p.Release(ctx)
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(2 * cfg.QueueTTL):
		t.Fatal("waiter stranded after its notification was lost")
	}
}

// TestPurgedLiveWaiter: a live waiter wrongly purged as expired (its
// process stalled past its queue lease) gets its place back and is served.
func TestPurgedLiveWaiter(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	cfg := Config{Name: t.Name(), Capacity: 1, QueueTTL: 600 * time.Millisecond}
	holder, waiter := e.sem(t, cfg), e.sem(t, cfg)
	p := acquire(t, holder, time.Second)
	got := make(chan error, 1)
	go func() {
		q, err := waiter.Acquire(ctx)
		if err == nil {
			q.Release(ctx)
		}
		got <- err
	}()
	waitFor(t, time.Second, "a waiter", func() bool { return queueLen(t, e.rdb, holder) == 1 })
	ids := e.rdb.ZRange(ctx, holder.keys[1], 0, -1).Val()
	e.rdb.ZRem(ctx, holder.keys[1], ids[0])
	e.rdb.ZRem(ctx, holder.keys[0], ids[0])
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

// TestRedisDown: while Redis is down or frozen, Acquire fails or returns at
// its deadline, never later; held leases are reported lost; after a
// restart everything works again.
func TestRedisDown(t *testing.T) {
	e := newEnv(t)
	e.srv.RequireReal(t)
	ctx := context.Background()
	const lease = 300 * time.Millisecond
	s := e.sem(t, Config{Name: t.Name(), Capacity: 1, LeaseTTL: lease, QueueTTL: lease})
	p := acquire(t, s, time.Second)

	if err := e.srv.Pause(); err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	start := time.Now()
	_, err := s.Acquire(c)
	cancel()
	if took := time.Since(start); err == nil || took > 200*time.Millisecond {
		t.Fatalf("Acquire on frozen Redis: %v after %v, want an error by its 100ms deadline", err, took)
	}
	if err := e.srv.Kill(); err != nil {
		t.Fatal(err)
	}
	c, cancel = context.WithTimeout(ctx, 200*time.Millisecond)
	start = time.Now()
	_, err = s.Acquire(c)
	cancel()
	if took := time.Since(start); err == nil || took > 300*time.Millisecond {
		t.Fatalf("Acquire on dead Redis: %v after %v, want an error by its deadline", err, took)
	}
	t.Logf("Acquire on dead Redis: %v", err)
	select {
	case <-p.Lost():
	case <-time.After(3 * lease):
		t.Fatal("held permit not reported lost while Redis was down")
	}
	if err := p.Release(ctx); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Release of a permit lost to an outage: %v", err)
	}
	if err := e.srv.Restart(); err != nil {
		t.Fatal(err)
	}
	var q *Permit
	waitFor(t, 5*time.Second, "Acquire to work after the restart", func() bool {
		c, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		q, err = s.Acquire(c)
		return err == nil
	})
	if err := q.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestRestartLosesLeases: Redis restarted empty; a holder learns at its
// next renewal that its lease is gone.
func TestRestartLosesLeases(t *testing.T) {
	e := newEnv(t)
	e.srv.RequireReal(t)
	const lease = 600 * time.Millisecond
	s := e.sem(t, Config{Name: t.Name(), Capacity: 1, LeaseTTL: lease, QueueTTL: lease})
	p := acquire(t, s, time.Second)
	if err := e.srv.Restart(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Lost():
	case <-time.After(2 * lease):
		t.Fatal("holder never learned the restart took its lease")
	}
}

// TestUnreachableRedisNamed: with Redis down, Acquire's error names the
// refused connection. An arrival that cannot be recorded fails at once,
// not as the caller's deadline; so does a waiter already queued, within
// the bound (min(LeaseTTL, QueueTTL)), long before its deadline.
func TestUnreachableRedisNamed(t *testing.T) {
	e := newEnv(t)
	e.srv.RequireReal(t)
	const lease = 300 * time.Millisecond
	s := e.sem(t, Config{Name: t.Name(), Capacity: 1, LeaseTTL: lease, QueueTTL: lease})
	acquire(t, s, time.Second) // held: the next caller queues
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errc := make(chan error, 1)
	go func() {
		_, err := s.Acquire(ctx)
		errc <- err
	}()
	waitFor(t, 2*time.Second, "the waiter to queue", func() bool { return queueLen(t, e.rdb, s) == 1 })
	if err := e.srv.Kill(); err != nil {
		t.Fatal(err)
	}
	err := <-errc
	if errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, syscall.ECONNREFUSED) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("queued waiter with Redis down: %v, want connection refused, not a deadline", err)
	}
	if ctx.Err() != nil {
		t.Fatal("the queued waiter waited for its deadline")
	}
	t.Logf("queued waiter: %v", err)

	// A fresh arrival, with time to spare, fails on the refused connection.
	ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err = s.Acquire(ctx)
	if !errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "connection refused") {
		t.Fatalf("arrival with Redis down: %v, want connection refused, not a deadline", err)
	}
	if ctx.Err() != nil {
		t.Fatal("the arrival waited for its deadline")
	}
	t.Logf("arrival: %v", err)
}
