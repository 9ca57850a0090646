package bucket_test

import (
	"context"
	"errors"
	"math"
	"net/http"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/upstream"
)

// TestHoldUnderLoad: a hold in the middle of a saturated run. No slot
// falls inside it but those already handed out, which Hold counts; after
// it the bucket resumes at its rate, and every grant keeps the limit.
func TestHoldUnderLoad(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	cfg := bucket.Config{Name: t.Name(), Capacity: 5, RefillAmount: 1, RefillFrequency: 10 * time.Millisecond}
	b := newBucket(t, rdb, cfg)
	ctx := withTimeout(t, 20*time.Second)
	run, stop := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer stop()
	type result struct {
		from, to time.Time
		owed     int
		err      error
	}
	held := make(chan result, 1)
	const hold = 400 * time.Millisecond
	go func() {
		time.Sleep(500 * time.Millisecond)
		from := time.Now()
		owed, err := b.Hold(ctx, hold)
		held <- result{from: from, to: time.Now(), owed: owed, err: err}
	}()
	grants, errs := saturate(run, b, 20)
	h := <-held
	if h.err != nil {
		t.Fatal(h.err)
	}
	if len(errs) > 0 {
		t.Fatalf("%d Enters failed, first: %v", len(errs), errs[0])
	}
	checkGrants(t, grants, cfg)
	// The hold began on Redis between from and to; it ends hold later.
	inside, after := 0, []time.Time{}
	for _, g := range grants {
		s := g.SlotTime()
		switch {
		case s.After(h.to) && s.Before(h.from.Add(hold)):
			inside++
		case !s.Before(h.from.Add(hold)):
			after = append(after, s)
		}
	}
	if inside > h.owed {
		t.Errorf("%d slots inside the hold, but Hold counted %d handed out before it", inside, h.owed)
	}
	if len(after) < 30 {
		t.Errorf("%d grants after the hold: the bucket did not resume", len(after))
	}
	t.Logf("%d grants, %d inside the hold (%d handed out before it), %d after", len(grants), inside, h.owed, len(after))
}

// TestSync: a quota the upstream reports lowers the level, never raises
// it, and when lowered, holds the refills until the reset; a quota of a
// unit no policy counts changes nothing.
func TestSync(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	cfg := bucket.Config{Name: t.Name(), Capacity: 10, RefillAmount: 1, RefillFrequency: 10 * time.Millisecond,
		Policies: []bucket.Policy{{Unit: "pu", Capacity: 1000, RefillAmount: 1, RefillFrequency: time.Millisecond}}}
	b := newBucket(t, rdb, cfg)
	ctx := withTimeout(t, 10*time.Second)
	if lowered, err := b.Sync(ctx, upstream.Quota{Unit: "", Limit: -1, Remaining: 3, Reset: 300 * time.Millisecond}); err != nil || !lowered {
		t.Fatalf("Sync to 3 remaining: %v, %v; want lowered", lowered, err)
	}
	if lowered, err := b.Sync(ctx, upstream.Quota{Unit: "", Limit: -1, Remaining: 50}); err != nil || lowered {
		t.Fatalf("Sync to 50 remaining: %v, %v; want left alone (never raised)", lowered, err)
	}
	if lowered, err := b.Sync(ctx, upstream.Quota{Unit: "tokens", Limit: -1, Remaining: 0}); err != nil || lowered {
		t.Fatalf("Sync of a unit no policy counts: %v, %v; want nothing", lowered, err)
	}
	for i := range 3 {
		rep, err := enterReport(ctx, b)
		if err != nil || rep.Position != 0 || rep.Slot.After(time.Now().Add(time.Millisecond)) {
			t.Fatalf("Enter %d of the 3 remaining: %+v, %v; want at once", i, rep, err)
		}
	}
	est, err := b.Estimate(ctx, bucket.Cost{"": 1})
	if err != nil || est.Wait < 200*time.Millisecond {
		t.Fatalf("the 4th caller would wait %v (%v); want until the reset, about 300ms", est.Wait, err)
	}
	if _, err := b.Hold(ctx, time.Second, "tokens"); err == nil {
		t.Error("Hold of a unit no policy counts succeeded")
	}
}

// TestFeedbackHoldsEveryProcess: a Retry-After fed back by one process
// holds another's callers too, and a signal that asks for nothing costs
// no round trip (it succeeds with Redis gone).
func TestFeedbackHoldsEveryProcess(t *testing.T) {
	srv := redistest.New(t)
	rdb := srv.Client()
	defer rdb.Close()
	cfg := bucket.Config{Name: t.Name(), Capacity: 2, RefillAmount: 1, RefillFrequency: 5 * time.Millisecond}
	a := newBucket(t, rdb, cfg)
	other := srv.Client()
	defer other.Close()
	b := newBucket(t, other, cfg)
	ctx := withTimeout(t, 10*time.Second)
	if err := b.Enter(ctx); err != nil {
		t.Fatal(err)
	}
	if err := a.Feedback(ctx, upstream.Signal{Status: 429, Refused: true, RetryAfter: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	rep, err := b.EnterReport(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited < 250*time.Millisecond {
		t.Errorf("the other process's caller started %v after the hold began (%+v); want after the 300ms hold", waited, rep)
	}
	// On a client that is closed, only a signal that asks for something
	// fails: the others make no round trip.
	closed := srv.Client()
	c := newBucket(t, closed, cfg)
	closed.Close()
	if err := c.Feedback(ctx, upstream.Signal{Status: 200}); err != nil {
		t.Errorf("Feedback of a signal that says nothing: %v", err)
	}
	if err := c.Feedback(ctx, upstream.Signal{Status: 200, Quotas: []upstream.Quota{{Unit: "pu", Limit: -1, Remaining: 0}}}); err != nil {
		t.Errorf("Feedback of a quota of a unit no policy counts: %v", err)
	}
	if err := c.Feedback(ctx, upstream.Signal{Status: 429, Refused: true, RetryAfter: time.Second}); err == nil || !errors.Is(err, redis.ErrClosed) {
		t.Errorf("Feedback of a hold on a closed client = %v, want its error", err)
	}
}

// TestAdapt: with Adapt, a refusal slows every policy's refills by 0.85
// for every process (another process, without Adapt, follows), the
// refusals of one episode count once, and after a quiet spell the rate
// climbs back half the way to 95 % of the rate last refused.
func TestAdapt(t *testing.T) {
	srv := redistest.New(t)
	rdb := srv.Client()
	defer rdb.Close()
	cfg := bucket.Config{Name: t.Name(), Capacity: 5, RefillAmount: 1, RefillFrequency: 10 * time.Millisecond, Adapt: true}
	a := newBucket(t, rdb, cfg)
	plain := cfg
	plain.Adapt = false
	other := srv.Client()
	defer other.Close()
	b := newBucket(t, other, plain)
	ctx := withTimeout(t, 20*time.Second)
	if err := b.Enter(ctx); err != nil {
		t.Fatal(err)
	}
	refused := upstream.Signal{Status: 429, Refused: true}
	for range 3 { // one episode: counts once
		if err := a.Feedback(ctx, refused); err != nil {
			t.Fatal(err)
		}
	}
	every := func() time.Duration {
		ps, err := b.Policies(ctx)
		if err != nil || len(ps) != 1 {
			t.Fatalf("Limits = %v, %v", ps, err)
		}
		return ps[0].RefillFrequency
	}
	period := func(f float64) time.Duration { return time.Duration(math.Ceil(10_000/f)) * time.Microsecond }
	if got, want := every(), period(0.85); got < want-time.Microsecond || got > want+time.Microsecond {
		t.Fatalf("after a refusal the period is %v, want %v (the rate × 0.85)", got, want)
	}
	if err := b.Enter(ctx); err != nil {
		t.Fatalf("the process without Adapt, started with the configured policies: %v", err)
	}
	// Quiet: after 2 s, each step (tried by Enter, at most once a second)
	// climbs half the way to 0.95 of the rate refused (1): 0.9, ...
	want := period(0.9)
	waitFor(t, 10*time.Second, "the rate to creep back a step", func() bool {
		_ = a.Enter(ctx)
		return every() <= want+time.Microsecond
	})
	if got := every(); got < period(0.95) {
		t.Errorf("period %v: climbed back faster than the rule", got)
	}
	// SetPolicies ends the adaptation.
	if err := a.SetPolicies(ctx, bucket.AsIs, bucket.Policy{Capacity: 5, RefillAmount: 1, RefillFrequency: 10 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if got := every(); got != 10*time.Millisecond {
		t.Errorf("after SetPolicies the period is %v, want 10ms", got)
	}
}

// TestHoldKeepsLongPolicies: a hold stops every caller but empties no
// policy: a long policy (a monthly quota, here an hour's) keeps its budget
// through it, and a hold of one unit holds only the callers that take
// from it.
func TestHoldKeepsLongPolicies(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	b := newBucket(t, rdb, bucket.Config{Name: t.Name(), Capacity: 5, RefillAmount: 1, RefillFrequency: 10 * time.Millisecond,
		Policies: []bucket.Policy{{Unit: "pu", Capacity: 1000, RefillAmount: 1, RefillFrequency: time.Hour}}})
	ctx := withTimeout(t, 10*time.Second)
	if _, err := b.Hold(ctx, 300*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := b.EnterCost(ctx, bucket.Cost{"": 1, "pu": 100}); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Errorf("a caller started %v into a 300ms hold", d)
	}
	in, err := b.Inspect(ctx)
	if err != nil || len(in.Levels) != 2 || in.Levels[1].Tokens != 900 {
		t.Fatalf("after the hold: %+v, %v; want the hour's policy at 1000 - 100", in, err)
	}
	// A hold of "pu" holds the callers that take "pu", not the others.
	if _, err := b.Hold(ctx, time.Hour, "pu"); err != nil {
		t.Fatal(err)
	}
	if est, err := b.Estimate(ctx, bucket.Cost{"": 1}); err != nil || est.Wait > 50*time.Millisecond {
		t.Errorf("a call without pu during a pu hold would wait %v (%v)", est.Wait, err)
	}
	if est, err := b.Estimate(ctx, bucket.Cost{"": 1, "pu": 1}); err != nil || est.Wait < 50*time.Minute {
		t.Errorf("a call with pu during an hour's pu hold would wait %v (%v)", est.Wait, err)
	}
	if in, err := b.Inspect(ctx); err != nil || time.Until(in.HeldUntil) < 50*time.Minute {
		t.Errorf("Inspect during the hold: held until %v (%v)", in.HeldUntil, err)
	}
}

// TestSyncRemainingZero: the upstream reports nothing left while the
// bucket thinks it is full: the next grant waits for the reported reset.
func TestSyncRemainingZero(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	b := newBucket(t, rdb, bucket.Config{Name: t.Name(), Capacity: 10, RefillAmount: 1, RefillFrequency: 10 * time.Millisecond})
	ctx := withTimeout(t, 10*time.Second)
	if lowered, err := b.Sync(ctx, upstream.Quota{Limit: -1, Remaining: 0, Reset: 300 * time.Millisecond}); err != nil || !lowered {
		t.Fatalf("Sync to 0 remaining: %v, %v", lowered, err)
	}
	start := time.Now()
	if err := b.Enter(ctx); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d < 250*time.Millisecond {
		t.Errorf("the next grant came %v after a sync to 0 remaining with a 300ms reset", d)
	}
}

// TestSyncSteeredByWindow: Sentinel Hub's X-ProcessingUnits-Remaining
// says no limit or window; a Counter's Window steers it to the bucket's
// monthly policy of processing units, not to the per-minute one that
// fills fastest, through the transport's path (Parse, then Feedback).
func TestSyncSteeredByWindow(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	const month = 30 * 24 * time.Hour
	cfg := bucket.Config{Name: t.Name(), Policies: []bucket.Policy{
		bucket.Rate(1000, time.Minute, 1000).In("pu"),
		bucket.Rate(400_000, month, 400_000).In("pu"),
	}}
	b := newBucket(t, rdb, cfg)
	ctx := withTimeout(t, 10*time.Second)
	headers := upstream.SentinelHub
	headers.Counters = []upstream.Counter{{Unit: "pu", Remaining: "X-ProcessingUnits-Remaining", Window: month}}
	resp := &http.Response{StatusCode: http.StatusOK, Header: http.Header{"X-Processingunits-Remaining": {"1234.5"}}}
	s := headers.Parse(resp)
	if len(s.Quotas) != 1 || s.Quotas[0].Window != month || s.Quotas[0].Remaining != 1234 {
		t.Fatalf("parsed %+v, want one quota of 1234 pu over a month", s.Quotas)
	}
	if err := b.Feedback(ctx, s); err != nil {
		t.Fatal(err)
	}
	in, err := b.Inspect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if perMinute, monthly := in.Levels[0].Tokens, in.Levels[1].Tokens; perMinute < 999 || monthly > 1235 {
		t.Fatalf("levels after the sync: per minute %v, monthly %v; want the monthly one lowered to 1234, the other full", perMinute, monthly)
	}
}
