package bucket_test

// When Redis is away and the caller has no deadline: Enter fails within
// the documented bound (docs/guarantees.md, "When Redis is unreachable"),
// with an error naming the cause in words a person can act on.

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/internal/testing/testkit"
)

// unreachableBound is the documented bound (bucket.Enter's doc), and
// hangMargin what a loaded CI machine under -race may add: these tests
// catch hangs, they do not time the bound.
const (
	unreachableBound = 3 * time.Second
	hangMargin       = 2 * time.Second
)

// TestEnterRedisDownFromStart: against a Redis that is down from the
// start, Enter without a deadline fails within the bound and says why.
func TestEnterRedisDownFromStart(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	rdb := srv.Client()
	defer rdb.Close()
	b := newBucket(t, rdb, bucket.Config{Name: t.Name(), Capacity: 5, RefillAmount: 1, RefillFrequency: 10 * time.Millisecond})
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	for _, what := range []string{"first Enter", "second Enter"} {
		start := time.Now()
		err := b.Enter(context.Background())
		took := time.Since(start)
		t.Logf("%s returned after %v: %v", what, took.Round(time.Millisecond), err)
		if took > unreachableBound+hangMargin {
			t.Errorf("%s returned after %v, want ≤ %v (the bound) + %v", what, took, unreachableBound, hangMargin)
		}
		testkit.CheckUnreachable(t, "Enter", err, srv.Addr(), testkit.Refused)
	}
	// A shorter deadline still holds.
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := b.Enter(ctx)
	if took := time.Since(start); took > 100*time.Millisecond+deadlineSlack || err == nil {
		t.Errorf("Enter on a 100ms deadline: %v after %v", err, took)
	}
}

// TestEnterRedisGoneWhileWaiting: callers queued without a deadline, their
// slots an hour away, all return with an error within the bound once Redis
// is killed, or frozen (SIGSTOP).
func TestEnterRedisGoneWhileWaiting(t *testing.T) {
	for _, fault := range []string{testkit.Killed, testkit.Frozen} {
		t.Run(fault, func(t *testing.T) {
			srv := redistest.New(t)
			srv.RequireReal(t)
			rdb := srv.Client()
			defer rdb.Close()
			b := newBucket(t, rdb, bucket.Config{Name: t.Name(), Capacity: 1, RefillAmount: 1, RefillFrequency: time.Hour})
			if err := b.Enter(context.Background()); err != nil {
				t.Fatal(err) // the one token: everyone else queues
			}
			const callers = 20
			goAway := srv.Kill
			if fault == testkit.Frozen {
				goAway = srv.Pause
				defer srv.Resume()
			}
			testkit.CallersAway{
				Op: "Enter", Callers: callers, Fault: fault, Addr: srv.Addr(),
				Bound: unreachableBound + hangMargin,
				Call:  func() error { return b.Enter(context.Background()) },
				Queued: func() bool {
					in, err := b.Inspect(context.Background())
					return err == nil && in.Queued == callers
				},
				GoAway: goAway,
			}.Check(t)
		})
	}
}
