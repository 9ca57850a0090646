package local

import (
	"context"
	"errors"
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
		if tt.ok != (err == nil) || tt.ok != (c != nil) || (!tt.ok && !errors.Is(err, ErrConfig)) {
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
