package main

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
)

// TestSetPolicies: set-policies changes the policies in force, which the
// bucket's own handle then reports, with --rate/--burst and with
// --policy; each --carry rule carries the tokens over as it says.
func TestSetPolicies(t *testing.T) {
	url, rdb := server(t)
	cfg := bucket.Config{Name: t.Name(), Policies: []bucket.Policy{bucket.Rate(20, time.Second, 10)}}
	b := newBucket(t, rdb, cfg)
	ctx := context.Background()
	if err := b.EnterN(ctx, 5); err != nil { // half full
		t.Fatal(err)
	}

	changed := time.Now()
	out := sluice(t, "set-policies", "--redis", url, cfg.Name, "--rate", "200/1s", "--burst", "50").ok(t).stdout
	for _, want := range []string{"tokens carried over: proportional", "before:\n  calls: capacity 10, 1 every 50ms (20/s)", "now:\n  calls: capacity 50, 1 every 5ms (200/s)"} {
		if !strings.Contains(out, want) {
			t.Errorf("set-policies lacks %q:\n%s", want, out)
		}
	}
	if got, want := mustPolicies(t, b), []bucket.Policy{bucket.Rate(200, time.Second, 50)}; !slices.Equal(got, want) {
		t.Errorf("Limits after set-policies = %+v, want %+v", got, want)
	}
	r := decodeReport(t, sluice(t, "inspect", "--json", "--redis", url, cfg.Name).ok(t).stdout)
	// About half (5 of 10 before, and a few refills at 20/s), then the
	// refills at 200/s until inspect read it: a busy host (CI) may part
	// the two commands by 100 ms, 20 tokens.
	since := time.Since(changed)
	if tok, most := r.Policies[0].Tokens, min(50, 35+int64(200*since.Seconds())+1); tok < 25 || tok > most {
		t.Errorf("proportionally: %d tokens of 50, want about half (5 of 10 before, a few refills since), and at most %d with %v of refills at 200/s", tok, most, since)
	}

	pu := bucket.Policy{Unit: "pu", Capacity: 1000, RefillAmount: 1, RefillFrequency: 60 * time.Millisecond}
	sluice(t, "set-policies", "--redis", url, "--carry", "fill",
		"--policy", "unit=calls,rate=1000/min,burst=100",
		"--policy", "unit=pu,capacity=1000,refill_amount=1,refill_frequency=60ms", cfg.Name).ok(t)
	calls := bucket.Rate(1000, time.Minute, 100)
	if got, want := mustPolicies(t, b), []bucket.Policy{calls, pu}; !slices.Equal(got, want) {
		t.Errorf("Limits after set-policies --policy ... = %+v, want %+v", got, want)
	}
	r = decodeReport(t, sluice(t, "inspect", "--json", "--redis", url, cfg.Name).ok(t).stdout)
	if r.Policies[0].Tokens != 100 || r.Policies[1].Tokens != 1000 {
		t.Errorf("fill: tokens %d and %d, want both full (100, 1000)", r.Policies[0].Tokens, r.Policies[1].Tokens)
	}
	if err := b.EnterCost(ctx, bucket.Cost{"": 1, "pu": 60}); err != nil { // the bucket's own handle follows
		t.Fatal(err)
	}

	// Windows: a rolling second of calls and a fixed hour of pu.
	out = sluice(t, "set-policies", "--redis", url, "--carry", "fill",
		"--policy", "rolling=20/1s", "--policy", "unit=pu,fixed=5000/1h", cfg.Name).ok(t).stdout
	if !strings.Contains(out, "calls: capacity 20, 20 in any 1s (20/s)") || !strings.Contains(out, "pu: capacity 5000, 5000 each 1h0m0s (5000/h)") {
		t.Errorf("set-policies with windows says:\n%s", out)
	}
	fixed := bucket.Fixed(5000, time.Hour)
	fixed.Unit = "pu"
	if got, want := mustPolicies(t, b), []bucket.Policy{bucket.Rolling(20, time.Second), fixed}; !slices.Equal(got, want) {
		t.Errorf("Limits after set-policies with windows = %+v, want %+v", got, want)
	}
	if r := decodeReport(t, sluice(t, "inspect", "--json", "--redis", url, cfg.Name).ok(t).stdout); r.Policies[0].Kind != "rolling" || r.Policies[1].Kind != "fixed" {
		t.Errorf("inspect --json kinds %q, %q", r.Policies[0].Kind, r.Policies[1].Kind)
	}
	if e := sluice(t, "set-policies", "--redis", url, "--policy", "rolling=20/1s,burst=5", cfg.Name); e.code == 0 || !strings.Contains(e.stderr, "goes alone") {
		t.Errorf("rolling with burst: exit %d, %s", e.code, e.stderr)
	}
}

// TestSetPoliciesNeverUsed: on a bucket nobody used, set-policies stores the
// policies it is given, and nothing else.
func TestSetPoliciesNeverUsed(t *testing.T) {
	url, rdb := server(t)
	out := sluice(t, "set-policies", "--redis", url, "--rate", "10/1s", "--burst", "1", t.Name()).ok(t).stdout
	if !strings.Contains(out, "before: none stored") {
		t.Errorf("set-policies said:\n%s", out)
	}
	b := newBucket(t, rdb, bucket.Config{Name: t.Name(), Policies: []bucket.Policy{bucket.Rate(1, time.Hour, 1)}, Adopt: true})
	if got, want := mustPolicies(t, b), []bucket.Policy{bucket.Rate(10, time.Second, 1)}; !slices.Equal(got, want) {
		t.Errorf("Limits = %+v, want %+v", got, want)
	}
}
