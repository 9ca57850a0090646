package bucket_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// A bucket none of whose policies counts calls refuses Enter's cost (a
// nil Cost) with a clear error instead of letting every caller through
// unlimited; costs in its own units still work.
func TestEnterOnBucketCountingNoCalls(t *testing.T) {
	srv := redistest.New(t)
	rdb := srv.Client()
	defer rdb.Close()
	b := newBucket(t, rdb, bucket.Config{Policies: []bucket.Policy{bucket.Rate(10, time.Second, 2).In("tokens")}})
	ctx := context.Background()
	check := func(what string, err error) {
		t.Helper()
		if !errors.Is(err, sluice.ErrConfig) || !strings.Contains(err.Error(), "no policy in force counts calls") {
			t.Errorf("%s: %v, want ErrConfig saying no policy counts calls", what, err)
		}
	}
	check("Enter", b.Enter(ctx))
	_, err := b.Estimate(ctx, nil)
	check("Estimate(nil)", err)
	_, err = b.Reserve(ctx, nil)
	check("Reserve(nil)", err)
	if err := b.EnterCost(ctx, bucket.Cost{"tokens": 2}); err != nil {
		t.Fatalf("EnterCost of tokens: %v", err)
	}
	// The two tokens are spent: the next must wait for a refill.
	est, err := b.Estimate(ctx, bucket.Cost{"tokens": 1})
	if err != nil || est.Wait <= 0 {
		t.Fatalf("Estimate of 1 token after the burst = %+v, %v; want a wait", est, err)
	}
	if got := b.Stats().Granted; got != 1 {
		t.Fatalf("Granted = %d, want 1 (the refused calls took nothing)", got)
	}
}

// Estimate(ctx, nil) is Enter's cost: on a bucket whose only token is
// spent it says the wait a Cost{"": 1} is told, not 0.
func TestEstimateNilIsEntersCost(t *testing.T) {
	srv := redistest.New(t)
	rdb := srv.Client()
	defer rdb.Close()
	b := newBucket(t, rdb, bucket.Config{Capacity: 1, RefillAmount: 1, RefillFrequency: time.Hour})
	ctx := context.Background()
	if e, err := b.Estimate(ctx, nil); err != nil || e.Wait != 0 {
		t.Fatalf("Estimate(nil) on a full bucket = %+v, %v; want no wait", e, err)
	}
	if err := b.Enter(ctx); err != nil {
		t.Fatal(err)
	}
	nilEst, err := b.Estimate(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	one, err := b.Estimate(ctx, bucket.Cost{"": 1})
	if err != nil {
		t.Fatal(err)
	}
	if d := one.Wait - nilEst.Wait; nilEst.Wait < 59*time.Minute || d < -time.Second || d > time.Second {
		t.Fatalf("Estimate(nil) = %+v, Estimate(1 call) = %+v: want both about the hour until the refill", nilEst, one)
	}
	if e, err := b.Estimate(ctx, bucket.Cost{}); err != nil || e.Wait != 0 {
		t.Fatalf("Estimate of a cost that takes nothing = %+v, %v; want no wait (EnterCost returns at once)", e, err)
	}
}

// Rate(…).In(unit) is Rate's policy counting unit.
func TestRateIn(t *testing.T) {
	p := bucket.Rate(90_000, time.Minute, 15_000)
	q := p.In("tokens")
	if q.Unit != "tokens" || p.Unit != "" {
		t.Fatalf("In: %+v from %+v", q, p)
	}
	q.Unit = ""
	if q != p {
		t.Fatalf("In changed more than the unit: %+v, want %+v", q, p)
	}
}

// Errors say each thing once: "bucket: cost exceeds capacity: …", not
// "bucket: sluice: cost exceeds capacity", and still match the sentinels.
func TestErrorTextsSayEachThingOnce(t *testing.T) {
	srv := redistest.New(t)
	rdb := srv.Client()
	defer rdb.Close()
	b := newBucket(t, rdb, bucket.Config{Capacity: 1, RefillAmount: 1, RefillFrequency: time.Hour, MaxQueue: 1})
	ctx := context.Background()
	err := b.EnterN(ctx, 2)
	if !errors.Is(err, sluice.ErrCostExceedsCapacity) || !strings.HasPrefix(err.Error(), "bucket: cost exceeds capacity: 2 calls above") {
		t.Errorf("cost above capacity: %q", err)
	}
	if err := b.Enter(ctx); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	err = b.Enter(short)
	if !errors.Is(err, sluice.ErrWaitTooLong) || !errors.Is(err, sluice.ErrLimited) {
		t.Errorf("a wait past the deadline: %v, want ErrWaitTooLong", err)
	}
	b.Close()
	err = b.Enter(ctx)
	if !errors.Is(err, sluice.ErrClosed) || err.Error() != "bucket: closed" {
		t.Errorf("after Close: %q, want \"bucket: closed\"", err)
	}
	for _, e := range []error{sluice.ErrQueueFull, sluice.ErrWaitTooLong, sluice.ErrConfigMismatch, sluice.ErrClosed} {
		if n := strings.Count(e.Error(), "sluice"); n != 1 {
			t.Errorf("%q says sluice %d times", e, n)
		}
	}
	if !errors.Is(sluice.ErrConfigMismatch, sluice.ErrConfig) || !errors.Is(sluice.ErrQueueFull, sluice.ErrLimited) {
		t.Error("a sentinel no longer matches its parent")
	}
}
