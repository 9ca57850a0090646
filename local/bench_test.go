package local

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sync/semaphore"
	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice"
)

// These benchmarks never wait: the rate and the limit are far above what the
// callers can reach, so they measure what each call pays for bookkeeping.
// Each runs as impl=local (ours) and impl=raw (the library call it wraps,
// configured the same: rate.Limiter.Wait or semaphore.Weighted.Acquire), so
// `benchstat -col /impl` puts them side by side.

const (
	benchRate  = 1_000_000_000 // per second
	benchBurst = 1 << 20
)

func BenchmarkRateEnter(b *testing.B) {
	ctx := context.Background()
	b.Run("impl=local", func(b *testing.B) {
		r, err := NewRate(RateConfig{Rate: benchRate, Burst: benchBurst})
		if err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if err := r.Enter(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("impl=raw", func(b *testing.B) {
		lim := rate.NewLimiter(benchRate, benchBurst)
		b.ReportAllocs()
		for b.Loop() {
			if err := lim.Wait(ctx); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func BenchmarkRateEnterParallel(b *testing.B) {
	ctx := context.Background()
	b.Run("impl=local", func(b *testing.B) {
		r, _ := NewRate(RateConfig{Rate: benchRate, Burst: benchBurst})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := r.Enter(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("impl=raw", func(b *testing.B) {
		lim := rate.NewLimiter(benchRate, benchBurst)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := lim.Wait(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}

func BenchmarkConcurrencyAcquireRelease(b *testing.B) {
	ctx := context.Background()
	b.Run("impl=local", func(b *testing.B) {
		c, _ := NewConcurrency(ConcurrencyConfig{Limit: 1, AcquireTimeout: time.Second})
		b.ReportAllocs()
		for b.Loop() {
			if err := c.Acquire(ctx); err != nil {
				b.Fatal(err)
			}
			c.Release()
		}
	})
	b.Run("impl=raw", func(b *testing.B) {
		sem := semaphore.NewWeighted(1)
		b.ReportAllocs()
		for b.Loop() {
			if err := sem.Acquire(ctx, 1); err != nil {
				b.Fatal(err)
			}
			sem.Release(1)
		}
	})
}

func BenchmarkConcurrencyAcquireReleaseParallel(b *testing.B) {
	ctx := context.Background()
	const limit = 1 << 20 // never full: measures the lock, not the waiting
	b.Run("impl=local", func(b *testing.B) {
		c, _ := NewConcurrency(ConcurrencyConfig{Limit: limit, AcquireTimeout: time.Second})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := c.Acquire(ctx); err != nil {
					b.Error(err)
					return
				}
				c.Release()
			}
		})
	})
	b.Run("impl=raw", func(b *testing.B) {
		sem := semaphore.NewWeighted(limit)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if err := sem.Acquire(ctx, 1); err != nil {
					b.Error(err)
					return
				}
				sem.Release(1)
			}
		})
	})
}

func BenchmarkConcurrencyDo(b *testing.B) {
	ctx := context.Background()
	c, _ := NewConcurrency(ConcurrencyConfig{Limit: 1})
	fn := func(context.Context) error { return nil }
	b.ReportAllocs()
	for b.Loop() {
		if err := c.Do(ctx, fn); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkSpacerEnter(b *testing.B) {
	ctx := context.Background()
	s, _ := NewSpacer(SpacerConfig{Space: time.Nanosecond})
	b.ReportAllocs()
	for b.Loop() {
		if err := s.Enter(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkNoopDo(b *testing.B) {
	ctx := context.Background()
	fn := func(context.Context) error { return nil }
	var n Noop
	b.ReportAllocs()
	for b.Loop() {
		if err := n.Do(ctx, fn); err != nil {
			b.Fatal(err)
		}
	}
}

// counter is an Observer as a metrics package would be: a counter per
// result and a sum of waits, all atomic.
type counter struct {
	results [4]atomic.Int64
	waited  atomic.Int64
}

func (c *counter) Observe(e sluice.Event) {
	c.results[e.Result].Add(1)
	c.waited.Add(int64(e.Wait))
}

// BenchmarkObserver: the uncontended calls with no Observer and with one,
// side by side in one run; what the Observer costs is the difference (a
// clock read at each end, the Event, the call):
//
//	go test -run '^$' -bench Observer -count 10 ./local/ | benchstat -col /observer -
func BenchmarkObserver(b *testing.B) {
	ctx := context.Background()
	for _, o := range []struct {
		name string
		obs  sluice.Observer
	}{{"none", nil}, {"on", &counter{}}} {
		b.Run("limiter=rate/observer="+o.name, func(b *testing.B) {
			r, _ := NewRate(RateConfig{Rate: benchRate, Burst: benchBurst, Observer: o.obs})
			b.ReportAllocs()
			for b.Loop() {
				if err := r.Enter(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("limiter=concurrency/observer="+o.name, func(b *testing.B) {
			c, _ := NewConcurrency(ConcurrencyConfig{Limit: 1, Observer: o.obs})
			b.ReportAllocs()
			for b.Loop() {
				if err := c.Acquire(ctx); err != nil {
					b.Fatal(err)
				}
				c.Release()
			}
		})
	}
}
