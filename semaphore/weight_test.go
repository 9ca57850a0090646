package semaphore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
)

func acquireN(t *testing.T, s *Semaphore, n int, within time.Duration) *Permit {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	p, err := s.AcquireN(ctx, n)
	if err != nil {
		t.Fatalf("AcquireN(%d): %v", n, err)
	}
	return p
}

// heldWeight is the weight Redis counts as held.
func heldWeight(t *testing.T, rdb *redis.Client, s *Semaphore) int64 {
	t.Helper()
	n, err := redisHeld(rdb, s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// redisHeld is the weight Redis counts as held, read in one transaction:
// the holders, plus (weight - 1) for each holder in the weights hash.
func redisHeld(rdb *redis.Client, s *Semaphore) (int64, error) {
	ctx := context.Background()
	var leases, queue *redis.IntCmd
	var heavy *redis.StringSliceCmd
	_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		leases = p.ZCard(ctx, s.keys[0])
		queue = p.ZCard(ctx, s.keys[1])
		heavy = p.HVals(ctx, s.keys[3])
		return nil
	})
	if err != nil {
		return 0, err
	}
	n := leases.Val() - queue.Val()
	for _, v := range heavy.Val() {
		w, err := strconv.ParseInt(v, 10, 64)
		if err != nil || w < 2 {
			return 0, fmt.Errorf("weights hash holds %q", v)
		}
		n += w - 1
	}
	return n, nil
}

// TestAcquireNArguments: a weight above the capacity is refused at once,
// without a key written, and a weight below 1 is an error.
func TestAcquireNArguments(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.sem(t, Config{Name: t.Name(), Capacity: 3})
	start := time.Now()
	_, err := s.AcquireN(ctx, 4) // no deadline: it must not wait at all
	switch {
	case !errors.Is(err, sluice.ErrCostExceedsCapacity):
		t.Fatalf("AcquireN(4) on capacity 3: %v, want sluice.ErrCostExceedsCapacity", err)
	case errors.Is(err, sluice.ErrLimited):
		t.Fatalf("%v matches sluice.ErrLimited: retrying could never succeed", err)
	case !strings.Contains(err.Error(), "weight 4") || !strings.Contains(err.Error(), "Capacity 3"):
		t.Fatalf("%v: does not name the weight and the capacity", err)
	}
	t.Logf("AcquireN(4) after %v: %v", time.Since(start), err)
	for _, n := range []int{0, -1} {
		if p, err := s.AcquireN(ctx, n); err == nil || p != nil {
			t.Fatalf("AcquireN(%d): %v, %v; want an error", n, p, err)
		}
	}
	if n := e.rdb.DBSize(ctx).Val(); n != 0 {
		t.Fatalf("%d keys written by refused calls", n)
	}
	// Refused before Redis: the refusal holds with Redis unreachable too.
	unreachable := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer unreachable.Close()
	down, err := New(unreachable, Config{Name: t.Name(), Capacity: 3})
	if err != nil {
		t.Fatal(err)
	}
	defer down.Close()
	if _, err := down.AcquireN(ctx, 4); !errors.Is(err, sluice.ErrCostExceedsCapacity) {
		t.Fatalf("AcquireN(4) with Redis down: %v, want sluice.ErrCostExceedsCapacity", err)
	}
	// The whole capacity in one permit is fine, and is all of it.
	p := acquireN(t, s, 3, time.Second)
	if w := heldWeight(t, e.rdb, s); w != 3 {
		t.Fatalf("Redis counts %d held, want 3", w)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := s.Acquire(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire beside a permit of the whole capacity: %v, want deadline exceeded", err)
	}
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Second, "nothing but the config left", func() bool { return e.stateLeft(t) == 0 })
}

// TestWeightedBound: callers in several Semaphores (as separate processes
// would be) acquire random weights from 1 to Capacity; the weight held
// never exceeds Capacity, by the callers' count or by Redis's, and every
// weight is served.
func TestWeightedBound(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	const capacity, handles, callers, rounds = 5, 4, 4, 25
	cfg := Config{Name: t.Name(), Capacity: capacity}
	var sems []*Semaphore
	for range handles {
		sems = append(sems, e.sem(t, cfg))
	}
	var held, peak atomic.Int64
	var servedMu sync.Mutex
	served := map[int]int{} // weight -> grants
	var wg sync.WaitGroup
	for h, s := range sems {
		for c := range callers {
			wg.Go(func() {
				for r := range rounds {
					n := 1 + (h+c+r)%capacity // every weight, in every handle
					if rand.IntN(2) == 0 {
						n = 1 + rand.IntN(capacity)
					}
					actx, cancel := context.WithTimeout(ctx, 20*time.Second)
					p, err := s.AcquireN(actx, n)
					cancel()
					if err != nil {
						t.Errorf("AcquireN(%d): %v", n, err)
						return
					}
					now := held.Add(int64(n))
					for old := peak.Load(); now > old && !peak.CompareAndSwap(old, now); old = peak.Load() {
					}
					servedMu.Lock()
					served[n]++
					servedMu.Unlock()
					time.Sleep(time.Duration(rand.IntN(1000)) * time.Microsecond) // the work
					held.Add(-int64(n))
					select {
					case <-p.Lost():
						t.Errorf("a lease was lost in a healthy run")
					default:
					}
					if err := p.Release(ctx); err != nil {
						t.Errorf("Release: %v", err)
					}
				}
			})
		}
	}
	// Redis's own count, sampled while the callers run.
	done := make(chan struct{})
	var samples, redisPeak int64
	var sampler sync.WaitGroup
	sampler.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
			}
			w, err := redisHeld(e.rdb, sems[0])
			if err != nil {
				t.Error(err)
				return
			}
			if w > capacity {
				t.Errorf("Redis counts %d held on capacity %d", w, capacity)
			}
			samples++
			redisPeak = max(redisPeak, w)
		}
	})
	wg.Wait()
	close(done)
	sampler.Wait()
	t.Logf("grants by weight %v; peak held %d (Redis: %d in %d samples) of %d", served, peak.Load(), redisPeak, samples, capacity)
	if peak.Load() > capacity {
		t.Fatalf("%d held at once on capacity %d", peak.Load(), capacity)
	}
	total := 0
	for n := 1; n <= capacity; n++ {
		if served[n] == 0 {
			t.Errorf("weight %d never served", n)
		}
		total += served[n]
	}
	if total != handles*callers*rounds {
		t.Fatalf("%d grants, want %d", total, handles*callers*rounds)
	}
	waitFor(t, 2*time.Second, "nothing but the config left", func() bool { return e.stateLeft(t) == 0 })
}

// grantLog records the order in which waiters were granted.
type grantLog struct {
	mu    sync.Mutex
	order []string
}

func (g *grantLog) add(who string) {
	g.mu.Lock()
	g.order = append(g.order, who)
	g.mu.Unlock()
}

func (g *grantLog) get() []string {
	g.mu.Lock()
	defer g.mu.Unlock()
	return append([]string(nil), g.order...)
}

// TestWeightedFIFO: a waiter of weight 3 at the head holds back the
// weight-1 waiters behind it although their weight is free; it is served
// first, then they are.
func TestWeightedFIFO(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	cfg := Config{Name: t.Name(), Capacity: 3}
	holder, heavySem := e.sem(t, cfg), e.sem(t, cfg)
	lights := []*Semaphore{e.sem(t, cfg), e.sem(t, cfg)}
	p0 := acquire(t, holder, time.Second) // 2 of 3 stay free

	var log grantLog
	heavyGot := make(chan *Permit, 1)
	go func() {
		p, err := heavySem.AcquireN(ctx, 3)
		if err != nil {
			t.Error(err)
			close(heavyGot)
			return
		}
		log.add("heavy")
		heavyGot <- p
	}()
	waitFor(t, time.Second, "the heavy waiter to queue", func() bool { return queueLen(t, e.rdb, holder) == 1 })

	const nLight = 3
	var wg sync.WaitGroup
	lightPermits := make(chan *Permit, nLight)
	for i := range nLight {
		s := lights[i%len(lights)]
		wg.Go(func() {
			p, err := s.Acquire(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			log.add("light")
			lightPermits <- p
		})
		// Queued at arrival behind the heavy one, with 2 places free.
		waitFor(t, time.Second, "a light waiter to queue", func() bool { return queueLen(t, e.rdb, holder) == int64(i+2) })
	}
	if w := heldWeight(t, e.rdb, holder); w != 1 {
		t.Fatalf("Redis counts %d held, want 1", w)
	}
	if got := log.get(); len(got) != 0 {
		t.Fatalf("granted %v while the head's weight was not free", got)
	}

	if err := p0.Release(ctx); err != nil {
		t.Fatal(err)
	}
	heavy, ok := <-heavyGot
	if !ok {
		t.Fatal("heavy Acquire failed")
	}
	if w := heldWeight(t, e.rdb, holder); w != 3 {
		t.Fatalf("Redis counts %d held under the weight-3 permit, want 3", w)
	}
	if n := queueLen(t, e.rdb, holder); n != nLight {
		t.Fatalf("%d waiters behind the weight-3 holder, want %d", n, nLight)
	}
	if err := heavy.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(lightPermits)
	want := []string{"heavy", "light", "light", "light"}
	if got := log.get(); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("served %v, want %v", got, want)
	}
	if w := heldWeight(t, e.rdb, holder); w != nLight {
		t.Fatalf("Redis counts %d held, want %d", w, nLight)
	}
	for p := range lightPermits {
		p.Release(ctx)
	}
	waitFor(t, time.Second, "nothing but the config left", func() bool { return e.stateLeft(t) == 0 })
}

// TestCancelledHeavyHead: a weight-3 waiter at the head gives up; the
// weight-1 waiters it held back are served at once.
func TestCancelledHeavyHead(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	cfg := Config{Name: t.Name(), Capacity: 3}
	holder, heavySem, light := e.sem(t, cfg), e.sem(t, cfg), e.sem(t, cfg)
	p0 := acquire(t, holder, time.Second)
	hctx, cancel := context.WithCancel(ctx)
	heavyErr := make(chan error, 1)
	go func() {
		_, err := heavySem.AcquireN(hctx, 3)
		heavyErr <- err
	}()
	waitFor(t, time.Second, "the heavy waiter to queue", func() bool { return queueLen(t, e.rdb, holder) == 1 })
	var wg sync.WaitGroup
	got := make(chan *Permit, 2)
	for i := range 2 {
		wg.Go(func() {
			p, err := light.Acquire(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			got <- p
		})
		waitFor(t, time.Second, "a light waiter to queue", func() bool { return queueLen(t, e.rdb, holder) == int64(i+2) })
	}
	cancel()
	if err := <-heavyErr; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled heavy waiter: %v, want context.Canceled", err)
	}
	wg.Wait() // both served while p0 still holds its 1
	close(got)
	if n := queueLen(t, e.rdb, holder); n != 0 {
		t.Fatalf("%d waiters left in the queue", n)
	}
	if w := heldWeight(t, e.rdb, holder); w != 3 {
		t.Fatalf("Redis counts %d held, want 3 (the holder and the two served)", w)
	}
	p0.Release(ctx)
	for p := range got {
		p.Release(ctx)
	}
	waitFor(t, time.Second, "nothing but the config left", func() bool { return e.stateLeft(t) == 0 })
}

// TestHeavyHolderClosed: a Semaphore holding a weight-3 permit is closed;
// the whole weight comes back and the waiters behind get in.
func TestHeavyHolderClosed(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	cfg := Config{Name: t.Name(), Capacity: 3}
	heavySem, light := e.sem(t, cfg), e.sem(t, cfg)
	heavy := acquireN(t, heavySem, 3, time.Second)
	var wg sync.WaitGroup
	got := make(chan *Permit, 3)
	for i := range 3 {
		wg.Go(func() {
			p, err := light.Acquire(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			got <- p
		})
		waitFor(t, time.Second, "a light waiter to queue", func() bool { return queueLen(t, e.rdb, light) == int64(i+1) })
	}
	if err := heavySem.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-heavy.Lost():
	default:
		t.Fatal("the closed Semaphore's permit is not lost")
	}
	wg.Wait()
	close(got)
	if w := heldWeight(t, e.rdb, light); w != 3 {
		t.Fatalf("Redis counts %d held, want the three weight-1 permits", w)
	}
	for p := range got {
		p.Release(ctx)
	}
	waitFor(t, time.Second, "nothing but the config left", func() bool { return e.stateLeft(t) == 0 })
}

// TestHeavyHolderFrozen: a process holding a weight-3 permit stalls past
// its lease; its whole weight is freed, three weight-1 callers get in, and
// the thawed holder learns its lease is gone.
func TestHeavyHolderFrozen(t *testing.T) {
	e := newEnv(t)
	e.srv.RequireReal(t)
	ctx := context.Background()
	const lease = 400 * time.Millisecond
	cfg := Config{Name: t.Name(), Capacity: 3, LeaseTTL: lease, QueueTTL: lease}
	w := startWorker(t, "hold", workerConfig{Addr: e.srv.Addr(), Name: cfg.Name, Capacity: 3, LeaseTTL: lease, QueueTTL: lease, Weight: 3})
	if ev := w.next(t, 5*time.Second); ev.Ev != "acquired" {
		t.Fatalf("worker: %+v", ev)
	}
	s := e.sem(t, cfg)
	if n := heldWeight(t, e.rdb, s); n != 3 {
		t.Fatalf("Redis counts %d held under the worker's weight-3 permit, want 3", n)
	}
	if err := w.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer w.cmd.Process.Signal(syscall.SIGCONT)
	var permits []*Permit
	for range 3 {
		permits = append(permits, acquire(t, s, 5*lease))
	}
	started := time.Now()
	if n := heldWeight(t, e.rdb, s); n != 3 {
		t.Fatalf("Redis counts %d held, want the three weight-1 permits alone", n)
	}
	if err := w.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	ev := w.next(t, 5*lease)
	if ev.Ev != "lost" {
		t.Fatalf("thawed worker reported %+v, want lost", ev)
	}
	if validUntil := time.Unix(0, ev.ValidUntil); !validUntil.Before(started) {
		t.Fatalf("the frozen holder's lease ran until %v after the others started", validUntil.Sub(started))
	}
	if ev := w.next(t, 5*lease); ev.Ev != "released" || ev.Err != ErrLeaseLost.Error() {
		t.Fatalf("worker's Release after the loss: %+v, want %v", ev, ErrLeaseLost)
	}
	// Its late release freed nobody's weight.
	if n := heldWeight(t, e.rdb, s); n != 3 {
		t.Fatalf("Redis counts %d held after the lost permit's release, want 3", n)
	}
	for _, p := range permits {
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, time.Second, "nothing but the config left", func() bool { return e.stateLeft(t) == 0 })
}

// TestWeightsKeyTTL: the weights hash expires as the other keys do, after
// the last lease, and follows renewals.
func TestWeightsKeyTTL(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.sem(t, Config{Name: t.Name(), Capacity: 3, LeaseTTL: 3 * time.Second, QueueTTL: 600 * time.Millisecond})
	p := acquireN(t, s, 2, time.Second)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { s.AcquireN(wctx, 2); close(done) }()
	waitFor(t, time.Second, "a waiter", func() bool { return queueLen(t, e.rdb, s) == 1 })
	if got := e.rdb.HGetAll(ctx, s.keys[3]).Val(); len(got) != 1 || got[p.id] != "2" {
		t.Fatalf("weights hash %v, want the holder's weight 2 alone", got)
	}
	check := func(when string) {
		t.Helper()
		for _, k := range s.keys {
			ttl, err := e.rdb.PTTL(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			if left := time.Until(p.validUntil()); ttl < left {
				t.Errorf("%s: %s: TTL %v, want beyond the holder's lease (%v left)", when, k, ttl, left)
			}
		}
	}
	check("after the grant")
	first := p.validUntil()
	waitFor(t, 2*time.Second, "a renewal", func() bool { return p.validUntil().After(first) })
	check("after a renewal")
	cancel()
	<-done
	p.Release(ctx)
	waitFor(t, time.Second, "nothing but the config left", func() bool { return e.stateLeft(t) == 0 })
}
