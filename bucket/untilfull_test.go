package bucket_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/upstream"
)

// TestSyncUntilFull: a quota whose reset is the time until it is full
// again (UntilFull) lowers the level as any quota does, but does not stop
// the refills: the policy goes on refilling at its rate. The same quota
// read as a window's end (not UntilFull) holds the refills until the
// reset, as before.
func TestSyncUntilFull(t *testing.T) {
	srv := redistest.New(t)
	rdb := srv.Client()
	defer rdb.Close()
	cfg := bucket.Config{Capacity: 10, RefillAmount: 1, RefillFrequency: 20 * time.Millisecond}
	fullCfg, windowCfg := cfg, cfg
	fullCfg.Name, windowCfg.Name = t.Name()+"-full", t.Name()+"-window"
	full, window := newBucket(t, rdb, fullCfg), newBucket(t, rdb, windowCfg)
	ctx := withTimeout(t, 20*time.Second)

	q := upstream.Quota{Limit: -1, Remaining: 2, Reset: 10 * time.Second}
	untilFull := q
	untilFull.UntilFull = true
	if lowered, err := full.Sync(ctx, untilFull); err != nil || !lowered {
		t.Fatalf("Sync of an until-full quota to 2 remaining: %v, %v; want lowered", lowered, err)
	}
	if lowered, err := window.Sync(ctx, q); err != nil || !lowered {
		t.Fatalf("Sync of a window's quota to 2 remaining: %v, %v; want lowered", lowered, err)
	}
	tokens := func(b *bucket.Bucket) bucket.Level {
		t.Helper()
		in, err := b.Inspect(ctx)
		if err != nil || len(in.Levels) != 1 {
			t.Fatalf("Inspect = %+v, %v", in, err)
		}
		return in.Levels[0]
	}
	// Lowered: 2, and at most a few refills since (one every 20 ms).
	if l := tokens(full); l.Tokens > 6 {
		t.Fatalf("after the until-full sync the level is %d; want about 2 (not lowered)", l.Tokens)
	}
	// Refilling: back to full at the policy's rate (8 refills, 160 ms),
	// not after the quota's 10 s reset.
	waitFor(t, 5*time.Second, "the until-full policy to refill", func() bool { return tokens(full).Tokens == 10 })
	// The window's quota holds its refills until its reset.
	if l := tokens(window); l.Tokens > 2 || l.NextRefill < 8*time.Second {
		t.Errorf("after the window's sync: %+v; want 2 tokens and the next refill at the 10s reset", l)
	}
}

// TestFeedbackUntilFull: OpenAI's answer, read with upstream.OpenAI and fed
// back, empties the tokens policy (remaining 0) without stalling it for the
// 6 minutes OpenAI says the quota takes to be full again: the next caller
// waits for the policy's own refill.
func TestFeedbackUntilFull(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	// OpenAI's 150,000 tokens a minute: 2,500 a second.
	cfg := bucket.Config{Name: t.Name(), Capacity: 60, RefillAmount: 1, RefillFrequency: time.Second,
		Policies: []bucket.Policy{{Unit: "tokens", Capacity: 150000, RefillAmount: 2500, RefillFrequency: time.Second}}}
	b := newBucket(t, rdb, cfg)
	ctx := withTimeout(t, 20*time.Second)
	resp := &http.Response{StatusCode: http.StatusOK, Header: http.Header{
		"X-Ratelimit-Limit-Requests":     {"60"},
		"X-Ratelimit-Remaining-Requests": {"59"},
		"X-Ratelimit-Reset-Requests":     {"1s"},
		"X-Ratelimit-Limit-Tokens":       {"150000"},
		"X-Ratelimit-Remaining-Tokens":   {"0"},
		"X-Ratelimit-Reset-Tokens":       {"6m0s"},
	}}
	s := upstream.OpenAI.Parse(resp)
	if len(s.Quotas) != 2 || !s.Quotas[1].UntilFull || s.Quotas[1].Reset != 6*time.Minute {
		t.Fatalf("OpenAI's answer read as %+v", s)
	}
	if err := b.Feedback(ctx, s); err != nil {
		t.Fatal(err)
	}
	in, err := b.Inspect(ctx)
	if err != nil || len(in.Levels) != 2 {
		t.Fatalf("Inspect = %+v, %v", in, err)
	}
	if in.Levels[1].Tokens > 2500 {
		t.Fatalf("tokens left after remaining 0: %d; want about 0 (not lowered)", in.Levels[1].Tokens)
	}
	if in.Levels[0].Tokens > 59 {
		t.Errorf("calls left after remaining 59: %d", in.Levels[0].Tokens)
	}
	// A call of 1,000 tokens waits for the policy's refills (2,500 a
	// second), not for the 6 minutes until full.
	cost := bucket.Cost{"": 1, "tokens": 1000}
	est, err := b.Estimate(ctx, cost)
	if err != nil || est.Wait > 2*time.Second {
		t.Fatalf("a call of 1000 tokens would wait %v (%v); want at most a second", est.Wait, err)
	}
	start := time.Now()
	if err := b.EnterCost(withTimeout(t, 5*time.Second), cost); err != nil {
		t.Fatalf("EnterCost after the feedback: %v", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("the call started %v after the feedback; want within a second or so", d)
	}

	// The same answer read as a window's end stalls the policy until it.
	windowCfg := cfg
	windowCfg.Name = t.Name() + "-window"
	window := newBucket(t, rdb, windowCfg)
	s.Quotas[1].UntilFull = false
	if err := window.Feedback(ctx, s); err != nil {
		t.Fatal(err)
	}
	if est, err := window.Estimate(ctx, cost); err != nil || est.Wait < 5*time.Minute {
		t.Errorf("after a window's feedback of 0 left a call would wait %v (%v); want until the 6m reset", est.Wait, err)
	}
}
