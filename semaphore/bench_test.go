package semaphore

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
)

// roundTrips counts the commands a client sends (a script call is one).
type roundTrips struct{ n atomic.Int64 }

func (h *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmd)
	}
}

func (h *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		h.n.Add(1)
		return next(ctx, cmds)
	}
}

func benchSem(b *testing.B, capacity int) (*Semaphore, *roundTrips) {
	srv := redistest.New(b)
	rdb := srv.Client()
	b.Cleanup(func() { rdb.Close() })
	h := &roundTrips{}
	rdb.AddHook(h)
	s, err := New(rdb, Config{Name: b.Name(), Capacity: capacity})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	return s, h
}

// BenchmarkAcquireRelease: one caller, capacity to spare. Two round trips
// per op: the arrival and the release.
//
//	go test -run '^$' -bench . -count 6 ./semaphore/ | benchstat -
func BenchmarkAcquireRelease(b *testing.B) {
	s, h := benchSem(b, 1)
	ctx := context.Background()
	b.ReportAllocs()
	h.n.Store(0)
	for b.Loop() {
		p, err := s.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if err := p.Release(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(h.n.Load())/float64(b.N), "round-trips/op")
}

// BenchmarkAcquireReleaseParallel: 16 callers per CPU in one process
// contend for 4 places; arrivals share exchanges.
func BenchmarkAcquireReleaseParallel(b *testing.B) {
	s, h := benchSem(b, 4)
	ctx := context.Background()
	b.SetParallelism(16)
	b.ReportAllocs()
	h.n.Store(0)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			p, err := s.Acquire(ctx)
			if err != nil {
				b.Error(err)
				return
			}
			if err := p.Release(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(h.n.Load())/float64(b.N), "round-trips/op")
}
