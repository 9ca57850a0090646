package bucket_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// waitShadow waits until b's Stats count n shadow calls.
func waitShadow(t *testing.T, b *bucket.Bucket, n int64) sluice.Stats {
	t.Helper()
	waitFor(t, 20*time.Second, fmt.Sprintf("%d shadow calls heard back", n), func() bool { return b.Stats().Shadow >= n })
	return b.Stats()
}

// A bucket in shadow mode lets every call through, even while Redis is
// frozen, and records the waits the limiter would have made: the burst
// at once, then one a refill apart.
func TestShadowNeverBlocksAndRecordsTheWait(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	rdb := srv.Client()
	defer rdb.Close()
	obs := &recorder{}
	// A refill a second: a call's wait is a refill more than the one
	// before's, less the time between their arrivals, which a busy test
	// process stretches but never to a second.
	b := newBucket(t, rdb, bucket.Config{Capacity: 2, RefillAmount: 1, RefillFrequency: time.Second, Shadow: true, Observer: obs})
	ctx := context.Background()

	// Reported one by one: each would have waited a refill more.
	var waits []time.Duration
	for range 6 {
		rep, err := b.EnterReport(ctx)
		if err != nil || rep.Shadow.Refused {
			t.Fatalf("EnterReport = %+v, %v", rep, err)
		}
		waits = append(waits, rep.Shadow.Wait)
	}
	if waits[0] != 0 || waits[1] != 0 {
		t.Fatalf("the burst would have waited: %v", waits)
	}
	// The third waits a refill, less the time since the first arrived,
	// and a new bucket's refills start a little late (state.lua's
	// FRESH_LAG_US, 5 ms).
	if waits[2] < 500*time.Millisecond || waits[2] > time.Second+5*time.Millisecond {
		t.Fatalf("waits %v: want the third to wait one refill (1s)", waits)
	}
	for i := 3; i < len(waits); i++ {
		if d := waits[i] - waits[i-1]; d <= 0 || d > time.Second {
			t.Fatalf("waits %v: want one refill (1s) more each, from the third", waits)
		}
	}

	// Redis frozen: calls still return, and are heard of once it thaws.
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	for range 4 {
		if err := b.Enter(ctx); err != nil {
			srv.Resume()
			t.Fatalf("Enter while Redis is frozen: %v", err)
		}
	}
	if got := b.Stats().Shadow; got != 6 {
		srv.Resume()
		t.Fatalf("Stats count %d shadow calls while Redis was frozen, want the 6 reported", got)
	}
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	s := waitShadow(t, b, 10)
	if s.ShadowRefused != 0 || s.ShadowFailed != 0 || s.Granted != 0 || s.Waiting != 0 {
		t.Fatalf("Stats %+v: want 10 shadow calls, none refused or failed, none counted as real", s)
	}
	// The 4 sent while frozen came after the 6: each at least the 6th's
	// wait on, less the freeze.
	if s.ShadowWait <= sumOf(waits) {
		t.Fatalf("ShadowWait %v, want more than the first six's %v", s.ShadowWait, sumOf(waits))
	}
	evs := obs.all()
	if len(evs) != 10 {
		t.Fatalf("%d events, want 10", len(evs))
	}
	for _, e := range evs {
		if !e.Shadow || e.Result != sluice.Granted || e.Limiter != "bucket" {
			t.Fatalf("event %+v, want a granted shadow event", e)
		}
	}
}

func sumOf(ds []time.Duration) time.Duration {
	var s time.Duration
	for _, d := range ds {
		s += d
	}
	return s
}

// Shadow callers never slow the real callers of the same bucket, and a
// caller whose deadline its wait would pass is recorded as refused.
func TestShadowBesideRealCallers(t *testing.T) {
	srv := redistest.New(t)
	rdb := srv.Client()
	defer rdb.Close()
	cfg := bucket.Config{Name: t.Name(), Capacity: 3, RefillAmount: 1, RefillFrequency: time.Hour}
	real := newBucket(t, rdb, cfg)
	cfg.Shadow = true
	shadow := newBucket(t, rdb, cfg)
	ctx := context.Background()
	for range 50 {
		if err := shadow.Enter(ctx); err != nil {
			t.Fatal(err)
		}
	}
	s := waitShadow(t, shadow, 50)
	if s.ShadowRefused != 0 || s.ShadowWait < 40*47*time.Hour/2 {
		t.Fatalf("50 shadow calls on 3 an hour: %+v; want the 47 past the burst to wait hours each", s)
	}
	for i := range 3 {
		if ok, est, err := real.TryEnter(ctx, nil); !ok || err != nil {
			t.Fatalf("real try %d after 50 shadow calls = %v, %+v, %v; want the whole burst there", i, ok, est, err)
		}
	}
	short, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	rep, err := shadow.EnterReport(short)
	if err != nil || !rep.Shadow.Refused || rep.Shadow.Wait < time.Hour {
		t.Fatalf("a shadow call with a minute to wait hours = %+v, %v; want recorded as refused, with the estimate", rep, err)
	}
	if s := shadow.Stats(); s.ShadowRefused != 1 {
		t.Fatalf("Stats %+v, want 1 shadow refusal", s)
	}
	// Bad input is still an error.
	if err := shadow.EnterN(ctx, 4); err == nil {
		t.Fatal("a cost above Capacity passed in shadow mode")
	}
	if _, err := bucket.New(rdb, bucket.Config{Name: "w", Policies: []bucket.Policy{bucket.Fixed(10, time.Minute)}, Shadow: true}); err == nil {
		t.Fatal("New accepted Shadow with a window policy")
	}
}

// A reservation in shadow mode is granted at once and settles (or
// cancels) without an error: its settle goes to the shadow's state.
func TestShadowReserveSettles(t *testing.T) {
	srv := redistest.New(t)
	rdb := srv.Client()
	defer rdb.Close()
	b := newBucket(t, rdb, bucket.Config{Policies: []bucket.Policy{bucket.Rate(100, time.Second, 100), bucket.Rate(1000, time.Second, 1000).In("tokens")}, Shadow: true})
	ctx := context.Background()
	for i := range 3 {
		r, err := b.Reserve(ctx, bucket.Cost{"": 1, "tokens": 500})
		if err != nil {
			t.Fatal(err)
		}
		if i == 2 {
			err = r.Cancel(ctx)
		} else {
			err = r.Settle(ctx, bucket.Cost{"": 1, "tokens": 100})
		}
		if err != nil {
			t.Fatalf("reservation %d: %v", i, err)
		}
	}
	s := waitShadow(t, b, 3)
	if s.ShadowFailed != 0 || s.ShadowRefused != 0 {
		t.Fatalf("Stats %+v, want 3 shadow calls heard back, none failed", s)
	}
}
