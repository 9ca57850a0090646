package bucket_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// evalCalls is how many scripts the server ran (EVALSHA and EVAL).
func evalCalls(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	return int(calls(t, rdb, "evalsha") + calls(t, rdb, "eval"))
}

// TryEnter grants while tokens are there, then refuses with the
// estimate, taking nothing: one script a call.
func TestTryEnterGrantsThenRefuses(t *testing.T) {
	srv := redistest.New(t)
	rdb := srv.Client()
	defer rdb.Close()
	b := newBucket(t, rdb, bucket.Config{Capacity: 5, RefillAmount: 1, RefillFrequency: time.Hour})
	ctx := context.Background()
	for i, c := range []bucket.Cost{nil, {"": 3}} { // 1, then 3: 4 of 5
		ok, est, err := b.TryEnter(ctx, c)
		if err != nil || !ok || est != (bucket.Estimate{}) {
			t.Fatalf("try %d (%v) on a bucket with room = %v, %+v, %v; want granted", i, c, ok, est, err)
		}
	}
	before := evalCalls(t, rdb)
	ok, est, err := b.TryEnter(ctx, bucket.Cost{"": 2})
	if err != nil || ok {
		t.Fatalf("try of 2 with 1 left = %v, %+v, %v; want refused", ok, est, err)
	}
	if est.Wait < 59*time.Minute || est.Ahead != 0 {
		t.Fatalf("refusal's estimate %+v, want about the hour until the refill, nobody ahead", est)
	}
	if got := evalCalls(t, rdb) - before; got != 1 {
		t.Fatalf("a refused try ran %d scripts, want 1", got)
	}
	// It took nothing: the last token is still there.
	if ok, _, err := b.TryEnter(ctx, nil); !ok || err != nil {
		t.Fatalf("try of the last token = %v, %v; want granted", ok, err)
	}
	if ok, est, err := b.TryEnter(ctx, nil); ok || err != nil || est.Wait <= 0 {
		t.Fatalf("try on an empty bucket = %v, %+v, %v; want refused with a wait", ok, est, err)
	}
	in, err := b.Inspect(ctx)
	if err != nil || in.Queued != 0 {
		t.Fatalf("Inspect = %+v, %v; want nobody queued", in, err)
	}
	s := b.Stats()
	if s.Granted != 3 || s.Refused != 2 {
		t.Fatalf("Stats: %d granted, %d refused; want 3 and 2", s.Granted, s.Refused)
	}
}

// Many callers trying at once, in two processes' handles: exactly the
// capacity is granted, nobody ever queues, and a caller queued by Enter
// makes every try refused with the callers ahead counted.
func TestTryEnterNeverQueues(t *testing.T) {
	srv := redistest.New(t)
	rdb := srv.Client()
	defer rdb.Close()
	rdb2 := srv.Client()
	defer rdb2.Close()
	cfg := bucket.Config{Name: t.Name(), Capacity: 10, RefillAmount: 1, RefillFrequency: time.Hour}
	bs := []*bucket.Bucket{newBucket(t, rdb, cfg), newBucket(t, rdb2, cfg)}
	ctx := context.Background()
	var granted, refused atomic.Int64
	var wg sync.WaitGroup
	for i := range 200 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, est, err := bs[i%2].TryEnter(ctx, nil)
			switch {
			case err != nil:
				t.Error(err)
			case ok:
				granted.Add(1)
			case est.Wait <= 0:
				t.Errorf("refused with estimate %+v, want a wait", est)
			default:
				refused.Add(1)
			}
		}()
	}
	wg.Wait()
	if granted.Load() != 10 || refused.Load() != 190 {
		t.Fatalf("%d granted, %d refused; want 10 and 190", granted.Load(), refused.Load())
	}
	in, err := bs[0].Inspect(ctx)
	if err != nil || in.Queued != 0 {
		t.Fatalf("Inspect = %+v, %v; want nobody queued", in, err)
	}

	// A caller queued by Enter: a try waits for nothing and is refused,
	// with it ahead.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- bs[1].Enter(wctx) }()
	waitFor(t, 10*time.Second, "the Enter to queue", func() bool {
		in, err := bs[0].Inspect(ctx)
		return err == nil && in.Queued == 1
	})
	ok, est, err := bs[0].TryEnter(ctx, nil)
	if ok || err != nil || est.Ahead != 1 || est.Wait < 119*time.Minute {
		t.Fatalf("try behind a queued caller = %v, %+v, %v; want refused, 1 ahead, about two refills away", ok, est, err)
	}
	cancel()
	<-done
}
