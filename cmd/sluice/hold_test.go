package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
)

// TestHoldStopsGrants: after hold, a bucket with tokens to spare grants
// nothing until the hold's end.
func TestHoldStopsGrants(t *testing.T) {
	url, rdb := server(t)
	cfg := bucket.Config{Name: t.Name(), Policies: []bucket.Policy{bucket.Rate(100, time.Second, 5)}}
	b := newBucket(t, rdb, cfg)
	ctx := context.Background()
	if err := b.Enter(ctx); err != nil { // stores the policies
		t.Fatal(err)
	}
	const hold = 600 * time.Millisecond
	start := time.Now()
	out := sluice(t, "hold", "--redis", url, cfg.Name, hold.String()).ok(t).stdout
	if !strings.Contains(out, "held for 600ms from now (every policy)") || !strings.Contains(out, "0 slots already handed out left standing") {
		t.Errorf("hold said:\n%s", out)
	}
	if err := b.Enter(ctx); err != nil {
		t.Fatal(err)
	}
	// The hold began on the Redis clock after start; Redis shares this
	// machine's clock.
	if waited := time.Since(start); waited < hold-time.Millisecond || waited > hold+2*time.Second {
		t.Errorf("Enter returned %v after the hold began, want about %v", waited, hold)
	}
}

// TestHoldUnit: --unit holds only the policies counting that unit, and a
// unit no policy counts is bad usage naming the units in force.
func TestHoldUnit(t *testing.T) {
	url, rdb := server(t)
	cfg := bucket.Config{Name: t.Name(), Policies: []bucket.Policy{
		bucket.Rate(100, time.Second, 5),
		{Unit: "pu", Capacity: 100, RefillAmount: 1, RefillFrequency: time.Millisecond},
	}}
	b := newBucket(t, rdb, cfg)
	ctx := context.Background()
	if err := b.Enter(ctx); err != nil {
		t.Fatal(err)
	}
	res := sluice(t, "hold", "--redis", url, "--unit", "tokens", cfg.Name, "1s")
	if res.code != 2 || !strings.Contains(res.stderr, `--unit "tokens": no policy in force counts it (they count calls, pu)`) {
		t.Errorf("hold --unit tokens: exit %d, stderr %q", res.code, res.stderr)
	}

	const hold = 500 * time.Millisecond
	start := time.Now()
	out := sluice(t, "hold", "--redis", url, cfg.Name, hold.String(), "--unit", "pu").ok(t).stdout
	if !strings.Contains(out, "(the policies counting pu)") {
		t.Errorf("hold --unit pu said:\n%s", out)
	}
	if err := b.Enter(ctx); err != nil { // calls only: not held
		t.Fatal(err)
	}
	if waited := time.Since(start); waited > hold/2 {
		t.Errorf("Enter, which costs no pu, returned %v after a hold of pu, want at once", waited)
	}
	if err := b.EnterCost(ctx, bucket.Cost{"pu": 1}); err != nil {
		t.Fatal(err)
	}
	if waited := time.Since(start); waited < hold-time.Millisecond {
		t.Errorf("EnterCost of 1 pu returned %v after a hold of pu for %v", waited, hold)
	}
}
