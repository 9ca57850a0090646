package bucket_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// roundTrips counts the commands and pipelines a client sends: each is one
// round trip (EVALSHA's NOSCRIPT fallback shows as two).
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { r.n.Add(1); return next(ctx, cmd) }
}
func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { r.n.Add(1); return next(ctx, cmds) }
}

func benchBucket(b *testing.B, cfg bucket.Config) (*bucket.Bucket, *redis.Client, *roundTrips) {
	srv, err := redistest.Start()
	if err != nil {
		b.Skip(err)
	}
	b.Cleanup(srv.Close)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, PoolSize: 128})
	b.Cleanup(func() { rdb.Close() })
	cfg.Name = b.Name()
	bk, err := bucket.New(rdb, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { bk.Close() })
	rt := &roundTrips{}
	rdb.AddHook(rt)
	return bk, rdb, rt
}

// far is a limit far above reach: every Enter takes the fast path.
var far = bucket.Config{Capacity: 1 << 40, RefillAmount: 1 << 40, RefillFrequency: time.Second}

// BenchmarkPing is the floor: one go-redis round trip.
func BenchmarkPing(b *testing.B) {
	_, rdb, _ := benchBucket(b, far)
	ctx := context.Background()
	for b.Loop() {
		if err := rdb.Ping(ctx).Err(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkScript is a one-line script's round trip.
func BenchmarkScript(b *testing.B) {
	_, rdb, _ := benchBucket(b, far)
	s := redis.NewScript("return 1")
	ctx := context.Background()
	for b.Loop() {
		if err := s.Run(ctx, rdb, nil).Err(); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkEnterUncontended: one caller, tokens always free.
func BenchmarkEnterUncontended(b *testing.B) {
	bk, _, rt := benchBucket(b, far)
	ctx := context.Background()
	b.ReportAllocs()
	start := rt.n.Load()
	for b.Loop() {
		if err := bk.Enter(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(rt.n.Load()-start)/float64(b.N), "round-trips/op")
}

// BenchmarkEnterParallel: many goroutines of one process on one bucket,
// tokens always free: concurrent arrivals share round trips.
func BenchmarkEnterParallel(b *testing.B) {
	bk, _, rt := benchBucket(b, far)
	ctx := context.Background()
	b.SetParallelism(32)
	b.ReportAllocs()
	start := rt.n.Load()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := bk.Enter(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(rt.n.Load()-start)/float64(b.N), "round-trips/op")
}
