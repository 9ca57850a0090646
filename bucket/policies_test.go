package bucket_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// saturate runs callers goroutines entering b until ctx ends, and returns
// the grants and the errors (but those of calls cut short by ctx's end:
// go-redis may time the socket out a moment before ctx.Err() is set).
// refusedForDeadline reports that err is Enter's refusal of a caller
// whose turn comes after its ctx's deadline.
func refusedForDeadline(err error) bool {
	var wt *sluice.WaitTooLongError
	return errors.As(err, &wt) && wt.Deadline
}

func saturate(ctx context.Context, b *bucket.Bucket, callers int) (grants []loadgen.Grant, errs []error) {
	end, ok := ctx.Deadline()
	if !ok {
		end = time.Now().Add(24 * time.Hour)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				c, cancel := context.WithTimeout(ctx, 2*time.Second)
				start := time.Now()
				rep, err := enterReport(c, b)
				back := time.Now() // before mu, which every caller shares
				cancel()
				mu.Lock()
				switch {
				case err == nil:
					grants = append(grants, loadgen.Grant{Start: start.UnixNano(), End: back.UnixNano(), Slot: rep.Slot.UnixMicro(), Ticket: rep.Ticket})
				case refusedForDeadline(err) && end.Before(start.Add(2*time.Second)):
					// Its turn comes after the run's end: refused at once
					// for the run's deadline, as Enter promises.
				case ctx.Err() == nil && time.Until(end) > 100*time.Millisecond:
					errs = append(errs, err)
				}
				mu.Unlock()
				if err != nil && ctx.Err() == nil {
					time.Sleep(5 * time.Millisecond) // a refused caller backs off, as a real one would
				}
			}
		}()
	}
	wg.Wait()
	return grants, errs
}

// TestConfigMismatch: two processes with different limits on one bucket,
// in both orders of arrival. The one that arrives second fails with a
// *sluice.ConfigMismatchError naming both configurations (read with
// errors.As; it never applies its own), and no grant exceeds the limit in
// force: the first one's.
func TestConfigMismatch(t *testing.T) {
	slow := bucket.Rate(20, time.Second, 5)
	fast := bucket.Rate(200, time.Second, 50)
	for _, order := range [][2]bucket.Policy{{slow, fast}, {fast, slow}} {
		first, second := order[0], order[1]
		t.Run(fmt.Sprintf("%d-then-%d", first.Capacity, second.Capacity), func(t *testing.T) {
			rdb := redistest.New(t).Client()
			defer rdb.Close()
			cfg := func(p bucket.Policy) bucket.Config {
				return bucket.Config{Name: t.Name(), Capacity: p.Capacity, RefillAmount: p.RefillAmount, RefillFrequency: p.RefillFrequency}
			}
			a := newBucket(t, rdb, cfg(first))
			b := newBucket(t, rdb, cfg(second))
			ctx := withTimeout(t, 10*time.Second)
			if err := a.Enter(ctx); err != nil {
				t.Fatal(err)
			}
			err := b.Enter(ctx)
			if !errors.Is(err, sluice.ErrConfigMismatch) || !errors.Is(err, sluice.ErrConfig) {
				t.Fatalf("second process's Enter = %v, want sluice.ErrConfigMismatch", err)
			}
			for _, p := range []bucket.Policy{first, second} {
				if want := fmt.Sprintf("%d calls, %d every %v", p.Capacity, p.RefillAmount, p.RefillFrequency); !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not name %q", err, want)
				}
			}
			var mismatch *sluice.ConfigMismatchError
			if !errors.As(err, &mismatch) {
				t.Fatalf("second process's Enter = %v (%T), want a *sluice.ConfigMismatchError", err, err)
			}
			words := func(p bucket.Policy) string {
				return fmt.Sprintf("[%d calls, %d every %v]", p.Capacity, p.RefillAmount, p.RefillFrequency)
			}
			if mismatch.Limiter != "bucket" || mismatch.Name != t.Name() || mismatch.Mine != words(second) || mismatch.InForce != words(first) {
				t.Errorf("ConfigMismatchError = %+v, want bucket %q, Mine %q, InForce %q", *mismatch, t.Name(), words(second), words(first))
			}
			if _, err := b.Estimate(ctx, nil); !errors.Is(err, sluice.ErrConfigMismatch) {
				t.Errorf("second process's Estimate = %v, want sluice.ErrConfigMismatch", err)
			}
			if ps, err := b.Policies(ctx); err != nil || len(ps) != 1 || ps[0] != first {
				t.Errorf("Limits = %v, %v; want the first process's %v", ps, err, first)
			}
			// Both saturate for a second: only the first is granted, within
			// its own limit.
			run, stop := context.WithTimeout(ctx, time.Second)
			defer stop()
			var wg sync.WaitGroup
			var ga, gb []loadgen.Grant
			var eb []error
			wg.Add(2)
			go func() { defer wg.Done(); ga, _ = saturate(run, a, 10) }()
			go func() { defer wg.Done(); gb, eb = saturate(run, b, 10) }()
			wg.Wait()
			if len(gb) > 0 || len(eb) == 0 {
				t.Errorf("the second process got %d grants and %d errors, want none and some", len(gb), len(eb))
			}
			for _, e := range eb {
				if !errors.Is(e, sluice.ErrConfigMismatch) {
					t.Fatalf("the second process failed with %v, want sluice.ErrConfigMismatch", e)
				}
			}
			checkGrants(t, ga, cfg(first))
			if len(ga) < first.Capacity {
				t.Errorf("%d grants to the first process: not saturated", len(ga))
			}
		})
	}
}

// TestAdopt: a process with other policies and Adopt set enforces the
// ones in force, and its grants and the first process's together keep
// them.
func TestAdopt(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	inForce := bucket.Config{Name: t.Name(), Capacity: 5, RefillAmount: 1, RefillFrequency: 20 * time.Millisecond}
	a := newBucket(t, rdb, inForce)
	b := newBucket(t, rdb, bucket.Config{Name: t.Name(), Capacity: 50, RefillAmount: 1, RefillFrequency: 2 * time.Millisecond, Adopt: true})
	ctx := withTimeout(t, 10*time.Second)
	if err := a.Enter(ctx); err != nil {
		t.Fatal(err)
	}
	run, stop := context.WithTimeout(ctx, time.Second)
	defer stop()
	var wg sync.WaitGroup
	var ga, gb []loadgen.Grant
	var ea, eb []error
	wg.Add(2)
	go func() { defer wg.Done(); ga, ea = saturate(run, a, 8) }()
	go func() { defer wg.Done(); gb, eb = saturate(run, b, 8) }()
	wg.Wait()
	if len(ea)+len(eb) > 0 {
		t.Fatalf("errors: %v %v", ea, eb)
	}
	if len(gb) == 0 {
		t.Fatal("the adopting process got no grant")
	}
	checkGrants(t, append(ga, gb...), inForce)
}

// TestSetPoliciesUnderLoad: three worker processes saturate a bucket; this
// process changes its limit twice (down, then up) while they run. The
// workers, started with the first policies, follow without an error;
// every grant keeps the old limit before the change and the new one after
// it (slots assigned before a change, within the lookahead, are counted
// with the new limit's: they took their tokens from it).
func TestSetPoliciesUnderLoad(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	cfg, err := bucketConfig(t.Name(), 10, 1, 5*time.Millisecond) // 200/s
	if err != nil {
		t.Fatal(err)
	}
	steps := []bucket.Policy{
		{Capacity: 4, RefillAmount: 1, RefillFrequency: 20 * time.Millisecond},    // 50/s
		{Capacity: 20, RefillAmount: 1, RefillFrequency: 2500 * time.Microsecond}, // 400/s
	}
	const phase = 1200 * time.Millisecond
	start := time.Now().Add(500 * time.Millisecond)
	var procs []*loadgen.Proc
	for i := range 3 {
		procs = append(procs, startWorker(t, loadgen.Spec{Proc: i, Addr: srv.Addr(), Bucket: cfg, Callers: 20, Until: 3 * phase, Timeout: 5 * time.Second, StartAt: start.UnixNano()}))
	}
	rdb := srv.Client()
	defer rdb.Close()
	admin := newBucket(t, rdb, cfg)
	ctx := withTimeout(t, time.Minute)
	type change struct {
		from, to time.Time
		p        bucket.Policy
	}
	changes := []change{{p: bucket.Policy{Capacity: cfg.Capacity, RefillAmount: cfg.RefillAmount, RefillFrequency: cfg.RefillFrequency}}}
	for i, p := range steps {
		time.Sleep(time.Until(start.Add(time.Duration(i+1) * phase)))
		from := time.Now()
		if err := admin.SetPolicies(ctx, bucket.AsIs, p); err != nil {
			t.Fatal(err)
		}
		changes = append(changes, change{from: from, to: time.Now(), p: p})
		if ps, err := admin.Policies(ctx); err != nil || len(ps) != 1 || ps[0] != p {
			t.Fatalf("Limits after SetPolicies = %v, %v; want %v", ps, err, p)
		}
	}
	var all []loadgen.Grant
	for _, p := range procs {
		all = append(all, wait(t, p)...)
	}
	// Phase i's limit judges the slots from its change's end to the next
	// change's end: the slots handed out before a change keep the old
	// limit, and over windows longer than the lookahead those still to
	// come and the new ones keep the new limit (docs/limits.md). Judged
	// from the change's start, a change whose round trip took 31-79 ms
	// beside a busy loop counted up to that long of the old rate's slots
	// against the new limit (excess 2-8), on this code and the code before.
	for i, c := range changes {
		until := time.Now().Add(time.Hour)
		if i+1 < len(changes) {
			until = changes[i+1].to
		}
		var slots []time.Time
		for _, g := range all {
			if !g.OK() {
				t.Fatalf("a worker's Enter failed: %s", g.Err)
			}
			if s := g.SlotTime(); !s.Before(c.to) && s.Before(until) {
				slots = append(slots, s)
			}
		}
		l := guarantee.Limit{Capacity: c.p.Capacity, RefillAmount: c.p.RefillAmount, RefillFrequency: c.p.RefillFrequency}
		res := guarantee.Check(slots, l)
		if !res.OK() {
			t.Errorf("phase %d (%d every %v, burst %d): %v", i, c.p.RefillAmount, c.p.RefillFrequency, c.p.Capacity, res)
		}
		// Saturated: the phase used its limit (the middle of the phase,
		// away from the changes, is granted at the rate in force).
		mid0, mid1 := c.to.Add(phase/4), c.to.Add(3*phase/4)
		if i == 0 {
			mid0, mid1 = start.Add(phase/4), start.Add(3*phase/4)
		}
		n := 0
		for _, s := range slots {
			if !s.Before(mid0) && s.Before(mid1) {
				n++
			}
		}
		want := float64(mid1.Sub(mid0)) / float64(c.p.RefillFrequency) * float64(c.p.RefillAmount)
		t.Logf("phase %d: %d slots in the middle half, %.0f allowed; %v", i, n, want, res)
		if float64(n) < 0.8*want {
			t.Errorf("phase %d: %d slots in the middle half, want about %.0f (saturated at the new limit)", i, n, want)
		}
		if i > 0 {
			t.Logf("change %d took %v (SetPolicies round trip)", i, c.to.Sub(c.from))
		}
	}
}

// TestMigrateFormat1: a bucket whose state was written in format 1 (the
// layout before the configuration was stored) is read as it is and
// written back in this format, its levels kept: a caller entering finds
// the tokens the old state left, no more.
func TestMigrateFormat1(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	cfg := bucket.Config{Capacity: 5, RefillAmount: 1, RefillFrequency: time.Hour}
	b := newBucket(t, rdb, cfg)
	ctx := withTimeout(t, 10*time.Second)
	now, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	// Format 1, as the previous version wrote it: 2 of 5 tokens left.
	old := fmt.Sprintf("7 0 2 %d 1", now.UnixMicro())
	if err := rdb.Set(ctx, bucket.Keys(b).State, old, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		rep, err := b.EnterReport(ctx)
		if err != nil || rep.Position != 0 || rep.Ticket != int64(8+i) {
			t.Fatalf("Enter %d on the old state: %+v, %v; want granted at once, ticket %d", i, rep, err, 8+i)
		}
	}
	est, err := b.Estimate(ctx, bucket.Cost{"": 1})
	if err != nil || est.Wait < 50*time.Minute {
		t.Fatalf("after the 2 tokens the old state left: %+v, %v; want a wait of about an hour", est, err)
	}
	raw, _ := rdb.Get(ctx, bucket.Keys(b).State).Result()
	if f := strings.Fields(raw); len(f) < 8 || f[4] != "2" || f[2] != "0" || !strings.HasPrefix(f[5], "c") {
		t.Errorf("state after migration %q, want format 2 with 0 tokens and the configuration's id", raw)
	}
	conf, _ := rdb.Get(ctx, bucket.Keys(b).Config).Result()
	if !strings.HasPrefix(conf, "2 ") {
		t.Errorf("config key %q", conf)
	}
}

// TestConfigRenewedInUse: a bucket in steady use, whose callers are all
// granted on arrival (no scheduler, no read of the config key), still
// renews the config key's 30 days: every 64 grants.
func TestConfigRenewedInUse(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	b := newBucket(t, rdb, bucket.Config{Name: t.Name(), Capacity: 1000, RefillAmount: 1000, RefillFrequency: time.Millisecond})
	ctx := withTimeout(t, 10*time.Second)
	if err := b.Enter(ctx); err != nil {
		t.Fatal(err)
	}
	key := bucket.Keys(b).Config
	if err := rdb.PExpire(ctx, key, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	for range 64 {
		if err := b.Enter(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if ttl, err := rdb.PTTL(ctx, key).Result(); err != nil || ttl < 29*24*time.Hour {
		t.Errorf("config key's TTL %v (%v) after 64 grants, want renewed to 30 days", ttl, err)
	}
}
