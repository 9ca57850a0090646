package local

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice"
)

func TestNewConcurrencyValidates(t *testing.T) {
	tests := []struct {
		cfg ConcurrencyConfig
		ok  bool
	}{
		{ConcurrencyConfig{Limit: 1}, true},
		{ConcurrencyConfig{Limit: 4, AcquireTimeout: time.Second, RunTimeout: time.Minute}, true},
		{ConcurrencyConfig{}, false},
		{ConcurrencyConfig{Limit: -2}, false},
		{ConcurrencyConfig{Limit: 1, AcquireTimeout: -1}, false},
		{ConcurrencyConfig{Limit: 1, RunTimeout: -1}, false},
	}
	for _, tt := range tests {
		c, err := NewConcurrency(tt.cfg)
		if tt.ok != (err == nil) || tt.ok != (c != nil) || (!tt.ok && !errors.Is(err, errConfig)) {
			t.Errorf("NewConcurrency(%+v) = %v, %v; want ok %v", tt.cfg, c, err, tt.ok)
		}
	}
}

// TestConcurrencyBound runs many random-length calls and checks no more
// than Limit ever ran at once, and that Limit was reached.
func TestConcurrencyBound(t *testing.T) {
	for _, limit := range []int{1, 3, 10} {
		synctest.Test(t, func(t *testing.T) {
			c, _ := NewConcurrency(ConcurrencyConfig{Limit: limit})
			var running, most atomic.Int64
			var wg sync.WaitGroup
			rng := rand.New(rand.NewPCG(uint64(limit), 0))
			for range 100 {
				work := time.Duration(rng.Int64N(int64(time.Second)))
				arrive := time.Duration(rng.Int64N(int64(5 * time.Second)))
				wg.Go(func() {
					time.Sleep(arrive)
					err := c.Do(context.Background(), func(context.Context) error {
						n := running.Add(1)
						for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
						}
						time.Sleep(work)
						running.Add(-1)
						return nil
					})
					if err != nil {
						t.Errorf("Do: %v", err)
					}
				})
			}
			wg.Wait()
			if m := most.Load(); m != int64(limit) {
				t.Errorf("limit %d: at most %d ran at once, want exactly the limit", limit, m)
			}
		})
	}
}

func TestConcurrencyFIFO(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, _ := NewConcurrency(ConcurrencyConfig{Limit: 1})
		ctx := context.Background()
		if err := c.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
		var (
			mu    sync.Mutex
			order []int
			wg    sync.WaitGroup
		)
		for i := range 10 {
			wg.Go(func() {
				c.Do(ctx, func(context.Context) error {
					mu.Lock()
					order = append(order, i)
					mu.Unlock()
					return nil
				})
			})
			synctest.Wait() // queued before the next one starts
		}
		c.Release()
		wg.Wait()
		for i, got := range order {
			if got != i {
				t.Fatalf("ran in order %v, want arrival order", order)
			}
		}
		if len(order) != 10 {
			t.Fatalf("%d of 10 ran", len(order))
		}
	})
}

// holdFor takes every slot of c for d, in the background, and returns a
// function that waits for the holder to finish.
func holdFor(t *testing.T, c *Concurrency, n int, d time.Duration) func() {
	t.Helper()
	var wg sync.WaitGroup
	for range n {
		if err := c.Acquire(context.Background()); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			time.Sleep(d)
			c.Release()
		})
	}
	return wg.Wait
}

// free reports how many slots of c can be taken at once right now. Must run
// in a synctest bubble.
func free(c *Concurrency, limit int) int {
	n := 0
	for range limit + 1 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Nanosecond)
		err := c.Acquire(ctx)
		cancel()
		if err != nil {
			break
		}
		n++
	}
	for range n {
		c.Release()
	}
	return n
}

func TestConcurrencyTimeouts(t *testing.T) {
	const s = time.Second
	boom := errors.New("boom")
	tests := []struct {
		name     string
		cfg      ConcurrencyConfig
		hold     time.Duration // all slots held this long
		work     time.Duration // fn's run time; fn returns ctx.Err() if ctx ends first
		ctxAfter time.Duration // the caller's own deadline, if not zero
		wantErr  error
		wantAt   time.Duration // when Do returned
		wantRan  bool
	}{
		{"no wait", ConcurrencyConfig{Limit: 1, AcquireTimeout: s}, 0, s, 0, boom, s, true},
		{"acquire timeout", ConcurrencyConfig{Limit: 2, AcquireTimeout: s}, 3 * s, 0, 0, ErrTimeout, s, false},
		{"acquired in time", ConcurrencyConfig{Limit: 2, AcquireTimeout: 3 * s}, s, s, 0, boom, 2 * s, true},
		{"caller's deadline first", ConcurrencyConfig{Limit: 1, AcquireTimeout: 3 * s}, 5 * s, 0, s, context.DeadlineExceeded, s, false},
		{"run timeout during the wait", ConcurrencyConfig{Limit: 1, RunTimeout: 2 * s}, 5 * s, 0, 0, ErrTimeout, 2 * s, false},
		{"run timeout during the work", ConcurrencyConfig{Limit: 1, RunTimeout: 2 * s}, s, 5 * s, 0, context.DeadlineExceeded, 2 * s, true},
		{"run timeout not reached", ConcurrencyConfig{Limit: 1, RunTimeout: 3 * s}, s, s, 0, boom, 2 * s, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c, err := NewConcurrency(tt.cfg)
				if err != nil {
					t.Fatal(err)
				}
				wait := func() {}
				if tt.hold > 0 {
					wait = holdFor(t, c, tt.cfg.Limit, tt.hold)
				}
				ctx := context.Background()
				if tt.ctxAfter > 0 {
					var cancel context.CancelFunc
					ctx, cancel = context.WithTimeout(ctx, tt.ctxAfter)
					defer cancel()
				}
				t0, ran := time.Now(), false
				err = c.Do(ctx, func(ctx context.Context) error {
					ran = true
					select {
					case <-time.After(tt.work):
						return boom
					case <-ctx.Done():
						if tt.cfg.RunTimeout > 0 && !errors.Is(context.Cause(ctx), ErrTimeout) {
							t.Errorf("fn's context ended with cause %v, want ErrTimeout", context.Cause(ctx))
						}
						return ctx.Err()
					}
				})
				if !errors.Is(err, tt.wantErr) || time.Since(t0) != tt.wantAt || ran != tt.wantRan {
					t.Errorf("Do = %v after %v, ran %v; want %v after %v, ran %v", err, time.Since(t0), ran, tt.wantErr, tt.wantAt, tt.wantRan)
				}
				if errors.Is(tt.wantErr, sluice.ErrLimited) != errors.Is(err, sluice.ErrLimited) {
					t.Errorf("%v: wrong answer to errors.Is(err, sluice.ErrLimited)", err)
				}
				wait()
				if n := free(c, tt.cfg.Limit); n != tt.cfg.Limit {
					t.Errorf("%d of %d slots free afterwards", n, tt.cfg.Limit)
				}
			})
		})
	}
}

func TestConcurrencyReleasesOnPanic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, _ := NewConcurrency(ConcurrencyConfig{Limit: 1})
		func() {
			defer func() {
				if recover() == nil {
					t.Error("the panic did not reach the caller")
				}
			}()
			c.Do(context.Background(), func(context.Context) error { panic("boom") })
		}()
		if n := free(c, 1); n != 1 {
			t.Fatalf("%d of 1 slots free after a panic", n)
		}
	})
}

// TestConcurrencyCancellationStorm queues many waiters, cancels most at
// random, and checks the rest ran and every slot is free afterwards.
func TestConcurrencyCancellationStorm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const limit = 3
		c, _ := NewConcurrency(ConcurrencyConfig{Limit: limit, AcquireTimeout: 4 * time.Second})
		wait := holdFor(t, c, limit, 2*time.Second)
		rng := rand.New(rand.NewPCG(3, 4))
		var ran, cancelled, timedOut atomic.Int64
		var wg sync.WaitGroup
		for range 200 {
			ctx, cancel := context.WithCancel(context.Background())
			time.AfterFunc(time.Duration(rng.Int64N(int64(3*time.Second))), cancel)
			wg.Go(func() {
				defer cancel()
				err := c.Do(ctx, func(context.Context) error {
					ran.Add(1)
					time.Sleep(100 * time.Millisecond)
					return nil
				})
				switch {
				case err == nil:
				case errors.Is(err, context.Canceled):
					cancelled.Add(1)
				case errors.Is(err, ErrTimeout):
					timedOut.Add(1)
				default:
					t.Errorf("Do: %v", err)
				}
			})
		}
		wg.Wait()
		wait()
		if ran.Load() == 0 || cancelled.Load() == 0 {
			t.Fatalf("%d ran, %d cancelled: the storm did not happen", ran.Load(), cancelled.Load())
		}
		if n := free(c, limit); n != limit {
			t.Fatalf("%d of %d slots free after the storm", n, limit)
		}
	})
}

func TestConcurrencyAcquireRelease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, _ := NewConcurrency(ConcurrencyConfig{Limit: 2})
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := c.Acquire(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("Acquire with a cancelled context: %v", err)
		}
		if n := free(c, 2); n != 2 {
			t.Fatalf("%d of 2 slots free after a refused Acquire", n)
		}
		defer func() {
			if recover() == nil {
				t.Error("releasing more than acquired did not panic")
			}
		}()
		c.Release()
	})
}

// TestConcurrencyAcquireNCosts checks the costs that never wait: zero (at
// once, even behind a waiter, where semaphore.Weighted would queue it),
// negative and above the limit (refused at once, where semaphore.Weighted
// would block until ctx ends), and that none of them takes a slot.
func TestConcurrencyAcquireNCosts(t *testing.T) {
	live := context.Background()
	dead, cancel := context.WithCancel(live)
	cancel()
	tests := []costCase{
		{name: "zero", ctx: live, n: 0},
		{name: "zero with an ended context", ctx: dead, n: 0, wantErr: context.Canceled},
		{name: "negative", ctx: live, n: -2, bad: true, words: "negative cost -2"},
		{name: "just above the limit", ctx: live, n: 4, wantErr: sluice.ErrCostExceedsCapacity, words: "cost 4 above the Limit 3"},
		{name: "far above the limit", ctx: live, n: 1 << 40, wantErr: sluice.ErrCostExceedsCapacity, words: "above the Limit 3"},
		{name: "above the limit with an ended context", ctx: dead, n: 4, wantErr: sluice.ErrCostExceedsCapacity},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c, _ := NewConcurrency(ConcurrencyConfig{Limit: 3})
				wait := holdFor(t, c, 2, time.Second)
				var wg sync.WaitGroup
				wg.Go(func() { // a waiter for all three slots
					if err := c.AcquireN(live, 3); err != nil {
						t.Error(err)
						return
					}
					c.ReleaseN(3)
				})
				synctest.Wait()

				t0 := time.Now()
				err := c.AcquireN(tt.ctx, tt.n)
				if time.Since(t0) != 0 {
					t.Errorf("AcquireN(%d) took %v, want an answer at once", tt.n, time.Since(t0))
				}
				checkCostAnswer(t, fmt.Sprintf("AcquireN(%d)", tt.n), err, tt.bad, tt.wantErr, tt.words)
				if err == nil {
					c.ReleaseN(tt.n)
				}
				wait()
				wg.Wait()
				if n := free(c, 3); n != 3 {
					t.Errorf("%d of 3 slots free afterwards", n)
				}
			})
		})
	}
}

// call is an AcquireN running in its own goroutine.
type call struct {
	done chan struct{}
	err  error
}

// acquireAsync starts AcquireN(ctx, n) in a goroutine of wg and returns once
// it has got its slots or is blocked waiting. Must run in a synctest bubble.
func acquireAsync(ctx context.Context, wg *sync.WaitGroup, c *Concurrency, n int) *call {
	k := &call{done: make(chan struct{})}
	wg.Go(func() {
		k.err = c.AcquireN(ctx, n)
		close(k.done)
	})
	synctest.Wait()
	return k
}

// returned reports whether the call has returned. Call it after
// synctest.Wait.
func (k *call) returned() bool {
	select {
	case <-k.done:
		return true
	default:
		return false
	}
}

// TestConcurrencyFIFOAcrossCosts queues a large cost and then a small one
// behind it: the small one waits though it would fit, until the large one
// has had its slots.
func TestConcurrencyFIFOAcrossCosts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, _ := NewConcurrency(ConcurrencyConfig{Limit: 3})
		ctx := context.Background()
		var wg sync.WaitGroup
		defer wg.Wait()
		if err := c.AcquireN(ctx, 1); err != nil {
			t.Fatal(err)
		}
		big := acquireAsync(ctx, &wg, c, 3)
		small := acquireAsync(ctx, &wg, c, 1)
		if big.returned() || small.returned() {
			t.Fatalf("with 2 of 3 slots free: cost 3 returned %v, cost 1 behind it returned %v; want both waiting", big.returned(), small.returned())
		}
		c.ReleaseN(1)
		synctest.Wait()
		if !big.returned() || big.err != nil || small.returned() {
			t.Fatalf("all 3 slots free: cost 3 returned %v (%v), cost 1 returned %v; want only cost 3", big.returned(), big.err, small.returned())
		}
		c.ReleaseN(3)
		synctest.Wait()
		if !small.returned() || small.err != nil {
			t.Fatalf("cost 1 after cost 3 released: returned %v (%v)", small.returned(), small.err)
		}
		c.Release()
		if n := free(c, 3); n != 3 {
			t.Fatalf("%d of 3 slots free at the end", n)
		}
	})
}

// TestConcurrencyCancellationRefundsCost cancels a waiting large cost: the
// small one behind it gets its slot in the same instant, as if the large one
// had never been there.
func TestConcurrencyCancellationRefundsCost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, _ := NewConcurrency(ConcurrencyConfig{Limit: 3})
		var wg sync.WaitGroup
		defer wg.Wait()
		if err := c.AcquireN(context.Background(), 2); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		big := acquireAsync(ctx, &wg, c, 3)
		small := acquireAsync(context.Background(), &wg, c, 1)
		if big.returned() || small.returned() {
			t.Fatal("want both waiting behind the 2 slots held")
		}
		t0 := time.Now()
		cancel()
		synctest.Wait()
		if !big.returned() || !errors.Is(big.err, context.Canceled) {
			t.Fatalf("cancelled cost 3: returned %v with %v, want context.Canceled", big.returned(), big.err)
		}
		if !small.returned() || small.err != nil || time.Since(t0) != 0 {
			t.Fatalf("cost 1 behind it: returned %v with %v after %v, want nil at once", small.returned(), small.err, time.Since(t0))
		}
		if n := free(c, 3); n != 0 {
			t.Fatalf("%d slots free with 2+1 held, want 0", n)
		}
		c.ReleaseN(2)
		c.Release()
		if n := free(c, 3); n != 3 {
			t.Fatalf("%d of 3 slots free at the end", n)
		}
	})
}

// TestConcurrencyAcquireNTimeout lets a large cost time out: it returns
// ErrTimeout after AcquireTimeout, holding nothing, and the small cost
// queued behind it half a second later goes in at that instant.
func TestConcurrencyAcquireNTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, _ := NewConcurrency(ConcurrencyConfig{Limit: 2, AcquireTimeout: time.Second})
		wait := holdFor(t, c, 1, 5*time.Second)
		defer wait()
		var wg sync.WaitGroup
		defer wg.Wait()
		ctx := context.Background()
		t0 := time.Now()
		big := acquireAsync(ctx, &wg, c, 2)
		time.Sleep(time.Second / 2) // so that cost 1's own timeout comes later
		small := acquireAsync(ctx, &wg, c, 1)
		<-big.done
		synctest.Wait()
		if !errors.Is(big.err, ErrTimeout) || time.Since(t0) != time.Second {
			t.Fatalf("cost 2 with 1 of 2 slots held: %v after %v, want ErrTimeout after 1s", big.err, time.Since(t0))
		}
		if !small.returned() || small.err != nil {
			t.Fatalf("cost 1 behind it: returned %v with %v, want nil when cost 2 gave up", small.returned(), small.err)
		}
		c.Release()
	})
}

// TestConcurrencyReleaseNPanics: releasing a negative count, or more than
// was acquired, is a bug in the caller and panics, as semaphore.Weighted
// does; ReleaseN(0) does nothing.
func TestConcurrencyReleaseNPanics(t *testing.T) {
	tests := []struct {
		name      string
		held      int
		release   int
		wantPanic bool
	}{
		{"negative", 1, -1, true},
		{"more than held", 2, 3, true},
		{"all held", 2, 2, false},
		{"zero", 0, 0, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _ := NewConcurrency(ConcurrencyConfig{Limit: 3})
			if err := c.AcquireN(context.Background(), tt.held); err != nil {
				t.Fatal(err)
			}
			defer func() {
				if got := recover() != nil; got != tt.wantPanic {
					t.Errorf("ReleaseN(%d) with %d held: panicked %v, want %v", tt.release, tt.held, got, tt.wantPanic)
				}
			}()
			c.ReleaseN(tt.release)
		})
	}
}

// TestConcurrencyCostBound runs many calls of random costs and lengths and
// checks the costs running at once never exceeded Limit.
func TestConcurrencyCostBound(t *testing.T) {
	for _, limit := range []int{1, 4, 10} {
		synctest.Test(t, func(t *testing.T) {
			c, _ := NewConcurrency(ConcurrencyConfig{Limit: limit})
			var running, most atomic.Int64
			var ran atomic.Int64
			var wg sync.WaitGroup
			rng := rand.New(rand.NewPCG(uint64(limit), 1))
			for range 100 {
				n := 1 + rng.IntN(limit)
				work := time.Duration(rng.Int64N(int64(time.Second)))
				arrive := time.Duration(rng.Int64N(int64(5 * time.Second)))
				wg.Go(func() {
					time.Sleep(arrive)
					if err := c.AcquireN(context.Background(), n); err != nil {
						t.Errorf("AcquireN(%d): %v", n, err)
						return
					}
					r := running.Add(int64(n))
					for m := most.Load(); r > m && !most.CompareAndSwap(m, r); m = most.Load() {
					}
					time.Sleep(work)
					running.Add(-int64(n))
					ran.Add(1)
					c.ReleaseN(n)
				})
			}
			wg.Wait()
			if m := most.Load(); m > int64(limit) || m == 0 {
				t.Errorf("limit %d: costs of %d ran at once", limit, m)
			}
			if ran.Load() != 100 {
				t.Errorf("limit %d: %d of 100 calls ran", limit, ran.Load())
			}
			if n := free(c, limit); n != limit {
				t.Errorf("%d of %d slots free afterwards", n, limit)
			}
		})
	}
}
