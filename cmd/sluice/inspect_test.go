package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/testing/buckettest"
	"github.com/sluicehq/sluice/upstream"
)

// dbsize is the number of keys in rdb's database.
func dbsize(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	n, err := rdb.DBSize(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestNeverUsed: on a bucket nobody used, inspect and limits say that no
// configuration is stored rather than show the command's placeholder,
// hold refuses, and none of them writes a key.
func TestNeverUsed(t *testing.T) {
	url, rdb := server(t)
	name := t.Name()

	out := sluice(t, "inspect", "--redis", url, name).ok(t).stdout
	if !strings.Contains(out, noConfig) || strings.Contains(out, "policies in force") {
		t.Errorf("inspect of a bucket never used:\n%s\nwant %q and no policies", out, noConfig)
	}
	r := decodeReport(t, sluice(t, "inspect", "--json", "--redis", url, name).ok(t).stdout)
	if r.Stored || len(r.Policies) != 0 || r.Queued != 0 || r.WaitUS != 0 || r.Scheduler != "" || r.Format != 0 || r.Bucket != name || r.Prefix != "sluice" {
		t.Errorf("inspect --json of a bucket never used = %+v, want stored false and nothing else", r)
	}
	if out := sluice(t, "policies", "--redis", url, name).ok(t).stdout; !strings.Contains(out, noConfig) {
		t.Errorf("limits of a bucket never used: %q, want %q", out, noConfig)
	}
	if out := sluice(t, "policies", "--json", "--redis", url, name).ok(t).stdout; !strings.Contains(out, `"stored":false,"policies":[]`) {
		t.Errorf("limits --json of a bucket never used: %s", out)
	}
	res := sluice(t, "hold", "--redis", url, name, "1s")
	if res.code != 1 || !strings.Contains(res.stderr, noConfig) {
		t.Errorf("hold of a bucket never used: exit %d, stderr %q; want exit 1 and %q", res.code, res.stderr, noConfig)
	}
	if n := dbsize(t, rdb); n != 0 {
		keys, _ := rdb.Keys(context.Background(), "*").Result()
		t.Errorf("inspect, limits and hold of a bucket never used wrote %d keys: %q", n, keys)
	}
}

// TestInspectMatchesInspect: --json is bucket.Inspect's answer, field by
// field, read between two calls of it; and the human output says the same.
func TestInspectMatchesInspect(t *testing.T) {
	url, rdb := server(t)
	cfg := bucket.Config{
		Name: t.Name(), KeyPrefix: "ops", Adapt: true,
		Policies: []bucket.Policy{
			{Capacity: 3, RefillAmount: 1, RefillFrequency: time.Hour},
			{Unit: "pu", Capacity: 1000, RefillAmount: 1, RefillFrequency: 60 * time.Millisecond},
		},
	}
	b := newBucket(t, rdb, cfg)
	ctx := context.Background()
	if err := b.EnterCost(ctx, bucket.Cost{"": 3, "pu": 600}); err != nil { // every call token: a new caller waits
		t.Fatal(err)
	}
	if err := b.Feedback(ctx, upstream.Signal{Status: 429, Refused: true}); err != nil { // Adapt slows it to 70 %
		t.Fatal(err)
	}

	before, err := b.Inspect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	r := decodeReport(t, sluice(t, "inspect", "--json", "--prefix", "ops", "--redis", url, cfg.Name).ok(t).stdout)
	after, err := b.Inspect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !before.Stored || before.Adapting != 0.85 {
		t.Fatalf("the test's bucket: Stored %v, Adapting %v; want a stored configuration slowed to 0.85", before.Stored, before.Adapting)
	}
	between := func(what string, got, a, b int64) {
		t.Helper()
		if lo, hi := min(a, b), max(a, b); got < lo || got > hi {
			t.Errorf("%s = %d, want between Inspect's %d and %d", what, got, a, b)
		}
	}
	if r.Bucket != cfg.Name || r.Prefix != "ops" || !r.Stored || r.Adapting != before.Adapting || r.Format != before.Format || r.Format == 0 {
		t.Errorf("report %+v, Inspect %+v", r, before)
	}
	between("now", r.Now.UnixMicro(), before.Now.UnixMicro(), after.Now.UnixMicro())
	between("queued", int64(r.Queued), int64(before.Queued), int64(after.Queued))
	between("wait_us", r.WaitUS, before.Wait.Microseconds(), after.Wait.Microseconds())
	if r.WaitUS <= 0 {
		t.Errorf("wait_us %d with no call token left, want > 0", r.WaitUS)
	}
	if r.Scheduler != "" && r.Scheduler != before.Scheduler && r.Scheduler != after.Scheduler {
		t.Errorf("scheduler %q, Inspect says %q then %q", r.Scheduler, before.Scheduler, after.Scheduler)
	}
	if len(r.Policies) != len(before.Policies) {
		t.Fatalf("%d policies, Inspect has %d", len(r.Policies), len(before.Policies))
	}
	for i, p := range before.Policies {
		got := r.Policies[i]
		want := toJSON(p)
		if got.policyJSON != want {
			t.Errorf("policy %d = %+v, Inspect has %+v", i, got.policyJSON, want)
		}
		between(fmt.Sprintf("policy %d tokens", i), got.Tokens, before.Levels[i].Tokens, after.Levels[i].Tokens)
		between(fmt.Sprintf("policy %d next_refill_us", i), got.NextRefillUS, before.Levels[i].NextRefill.Microseconds(), after.Levels[i].NextRefill.Microseconds())
	}
	// The policies in force are the slowed ones: 1 every 1h/0.85.
	if got := r.Policies[0]; got.Unit != "" || got.Capacity != 3 || got.RefillEveryUS != 4235294118 || got.Tokens != 0 {
		t.Errorf("policy 0 = %+v, want calls, capacity 3, 1 every 1h/0.85, no token", got)
	}

	out := sluice(t, "inspect", "--prefix", "ops", "--redis", url, cfg.Name).ok(t).stdout
	for _, want := range []string{
		fmt.Sprintf("bucket %q (prefix \"ops\")", cfg.Name),
		"policies in force:",
		"calls  3", "pu     1000",
		"slowed to 85% of the configured rate",
		"0 callers waiting",
		"would wait 1h10m",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, out)
		}
	}
	t.Logf("inspect:\n%s", out)
}

// TestInspectLanes: with callers in named lanes, inspect lists the lanes
// with callers as bucket.Inspect does (the most first, the default lane
// among them), and sums the ones past 20 on an "other lanes" row; with
// none, it shows no lanes.
func TestInspectLanes(t *testing.T) {
	url, rdb := server(t)
	cfg := bucket.Config{Name: t.Name(), Capacity: 1, RefillAmount: 1, RefillFrequency: time.Hour,
		Lanes: []bucket.Lane{{Name: "urgent", Priority: 1}}}
	b := newBucket(t, rdb, cfg)
	if err := b.Enter(context.Background()); err != nil { // the one token: every caller below queues
		t.Fatal(err)
	}
	buckettest.Queue(t, b, map[string]int{"": 1})
	if out := sluice(t, "inspect", "--redis", url, cfg.Name).ok(t).stdout; strings.Contains(out, "lanes") {
		t.Errorf("inspect with the default lane alone shows lanes:\n%s", out)
	}
	if r := decodeReport(t, sluice(t, "inspect", "--json", "--redis", url, cfg.Name).ok(t).stdout); r.Lanes == nil || len(r.Lanes) != 0 {
		t.Errorf("inspect --json with the default lane alone: lanes %#v, want []", r.Lanes)
	}

	lanes := map[string]int{"a": 3, "urgent": 2}
	for i := range 20 {
		lanes[fmt.Sprintf("t%02d", i)] = 1
	}
	buckettest.Queue(t, b, lanes)
	r := decodeReport(t, sluice(t, "inspect", "--json", "--redis", url, cfg.Name).ok(t).stdout)
	in, err := b.Inspect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if r.Queued != 26 || len(r.Lanes) != 20 || r.OtherLanes != 3 || r.OtherQueued != 3 {
		t.Fatalf("inspect --json: %d queued, %d lanes, other %d lanes of %d callers; want 26, 20, 3 of 3", r.Queued, len(r.Lanes), r.OtherLanes, r.OtherQueued)
	}
	for i, l := range in.Lanes {
		got := r.Lanes[i]
		// The waits are on an hour's refills: a few ms apart at most.
		if got.Name != l.Name || got.Priority != l.Priority || got.Queued != l.Queued || got.WaitUS < l.Wait.Microseconds() || got.WaitUS > l.Wait.Microseconds()+1e6 {
			t.Errorf("lanes[%d] = %+v, Inspect has %+v", i, got, l)
		}
	}
	if l := r.Lanes[1]; l.Name != "urgent" || l.Priority != 1 || l.Queued != 2 {
		t.Errorf("lanes[1] = %+v, want urgent, priority 1, 2 callers", l)
	}

	out := sluice(t, "inspect", "--redis", url, cfg.Name).ok(t).stdout
	if !strings.Contains(out, "26 callers waiting") || !strings.Contains(out, "lanes with callers, the most first:") {
		t.Errorf("inspect output lacks the callers or the lanes:\n%s", out)
	}
	// Lane a shares class 0 with 21 lanes: 4 turns of 22, 88 refills of
	// an hour off, less the time since the first Enter; urgent is alone
	// in class 1: 3.
	for _, want := range []struct {
		row  string
		wait time.Duration
	}{{"lane priority queued a new caller would wait", 0}, {"a 0 3", 88 * time.Hour}, {"urgent 1 2", 3 * time.Hour}, {"(default) 0 1", 44 * time.Hour}, {"3 other lanes 3", 0}} {
		if !slices.ContainsFunc(strings.Split(out, "\n"), func(line string) bool {
			f := strings.Fields(line)
			if want.wait == 0 {
				return strings.Join(f, " ") == want.row
			}
			if len(f) < 2 || strings.Join(f[:len(f)-1], " ") != want.row {
				return false
			}
			d, err := time.ParseDuration(f[len(f)-1])
			return err == nil && d <= want.wait && d > want.wait-time.Minute
		}) {
			t.Errorf("inspect output lacks the line %q (a wait of %v):\n%s", want.row, want.wait, out)
		}
	}
	t.Logf("inspect with lanes:\n%s", out)
}

// TestInspectSaturated: with callers queued behind a saturated bucket,
// inspect shows the queue, a wait, and this process as the scheduler, in
// both forms.
func TestInspectSaturated(t *testing.T) {
	url, rdb := server(t)
	cfg := bucket.Config{Name: t.Name(), Policies: []bucket.Policy{bucket.Rate(20, time.Second, 2)}}
	b := newBucket(t, rdb, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for range 16 {
		wg.Go(func() {
			for ctx.Err() == nil {
				if err := b.Enter(ctx); err != nil && !errors.Is(err, context.Canceled) {
					t.Errorf("Enter: %v", err)
					return
				}
			}
		})
	}

	host, _ := os.Hostname()
	me := fmt.Sprintf("%s:%d", host, os.Getpid())
	var r report
	waitFor(t, 10*time.Second, "inspect --json to show a queue and a scheduler", func() bool {
		r = decodeReport(t, sluice(t, "inspect", "--json", "--redis", url, cfg.Name).ok(t).stdout)
		return r.Queued >= 8 && r.Scheduler != ""
	})
	if r.Scheduler != me {
		t.Errorf("scheduler %q, want this process, %q", r.Scheduler, me)
	}
	if r.SchedulerTTLUS <= 0 || r.SchedulerTTLUS > time.Second.Microseconds() {
		t.Errorf("scheduler_ttl_us %d, want within the 1 s lock TTL", r.SchedulerTTLUS)
	}
	// Each of the callers ahead takes a token refilled every 50 ms.
	if min := int64(r.Queued-2) * 50_000; r.WaitUS < min {
		t.Errorf("wait_us %d with %d queued, want ≥ %d", r.WaitUS, r.Queued, min)
	}
	if len(r.Policies) != 1 || r.Policies[0].Tokens > 2 || r.Policies[0].RatePerSecond != 20 || !r.Stored || r.Adapting != 0 {
		t.Errorf("report %+v", r)
	}

	var out string
	waitFor(t, 10*time.Second, "inspect to show a queue and a scheduler", func() bool {
		out = sluice(t, "inspect", "--redis", url, cfg.Name).ok(t).stdout
		return !strings.Contains(out, " 0 callers") && strings.Contains(out, "scheduler:   "+me)
	})
	for _, want := range []string{"calls  2", "1 every 50ms", "20/s", "callers waiting", "would wait", "lock expires in", "not slowed", "state:       format"} {
		if !strings.Contains(out, want) {
			t.Errorf("inspect output lacks %q:\n%s", want, out)
		}
	}
	t.Logf("inspect during a saturated run:\n%s", out)
}

// TestWatch: --watch inspects again every --interval until interrupted,
// then exits 0; with --json, one object a line.
func TestWatch(t *testing.T) {
	url, rdb := server(t)
	b := newBucket(t, rdb, bucket.Config{Name: t.Name(), Policies: []bucket.Policy{bucket.Rate(10, time.Second, 10)}})
	if err := b.Enter(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, asJSON := range []bool{false, true} {
		args := []string{"inspect", "--watch", "--interval", "20ms", "--redis", url, t.Name()}
		if asJSON {
			args = append(args, "--json")
		}
		ctx, cancel := context.WithCancel(context.Background())
		var stdout, stderr syncBuffer
		done := make(chan error, 1)
		go func() { done <- run(ctx, args, &stdout, &stderr) }()
		waitFor(t, 10*time.Second, "three inspections", func() bool {
			return strings.Count(stdout.String(), "state:") >= 3 || strings.Count(stdout.String(), "\n") >= 3 && asJSON
		})
		cancel()
		select {
		case err := <-done:
			if err != nil || stderr.String() != "" {
				t.Errorf("%q after interrupt: %v, stderr %q", args, err, stderr.String())
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%q did not return after interrupt", args)
		}
		if !asJSON {
			continue
		}
		lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
		var last time.Time
		for _, l := range lines {
			r := decodeReport(t, l)
			if !r.Stored || !r.Now.After(last) {
				t.Errorf("inspection %+v, after one at %v", r, last)
			}
			last = r.Now
		}
	}
}

// TestLimits: limits shows the policies in force, with --json too.
func TestLimits(t *testing.T) {
	url, rdb := server(t)
	ps := []bucket.Policy{bucket.Rate(1000, time.Minute, 1000), {Unit: "pu", Capacity: 400000, RefillAmount: 1, RefillFrequency: 6696 * time.Millisecond}}
	b := newBucket(t, rdb, bucket.Config{Name: t.Name(), Policies: ps})
	if err := b.Enter(context.Background()); err != nil {
		t.Fatal(err)
	}
	out := sluice(t, "policies", "--redis", url, t.Name()).ok(t).stdout
	for _, want := range []string{"calls: capacity 1000, 1 every 60ms (1000/min)", "pu: capacity 400000, 1 every 6.696s (8.96/min)"} {
		if !strings.Contains(out, want) {
			t.Errorf("limits lacks %q:\n%s", want, out)
		}
	}
	got := sluice(t, "policies", "--json", "--redis", url, t.Name()).ok(t).stdout
	want := fmt.Sprintf(`{"bucket":%q,"prefix":"sluice","stored":true,"policies":[{"unit":"","capacity":1000,"refill_amount":1,"refill_every_us":60000,"rate_per_second":16.666666666666668},{"unit":"pu","capacity":400000,"refill_amount":1,"refill_every_us":6696000,"rate_per_second":0.14934289127837516}],"adapting":0}`+"\n", t.Name())
	if got != want {
		t.Errorf("limits --json:\n%s\nwant\n%s", got, want)
	}
	if !slices.Equal(ps, mustPolicies(t, b)) {
		t.Errorf("limits changed the policies")
	}
}

func mustPolicies(t *testing.T, b *bucket.Bucket) []bucket.Policy {
	t.Helper()
	ps, err := b.Policies(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return ps
}
