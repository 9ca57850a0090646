package bucket_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/enterdetail"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// costGrant is one granted EnterCost: its cost, ticket and slot.
type costGrant struct {
	cost   bucket.Cost
	ticket int64
	slot   time.Time
	start  time.Time
	// retimed: the caller came later than MaxLateness for its slot and
	// took a later one by design (Report.Retimes): it keeps no order.
	retimed bool
}

// checkCosts fails t when, for some policy, the costs granted in a window
// of slots exceed what the policy allows there (the guarantee with costs,
// guarantee.CheckCosts), when a later ticket got an earlier
// slot (FIFO across costs), or when a caller started before its slot.
func checkCosts(t *testing.T, gs []costGrant, policies []bucket.Policy) {
	t.Helper()
	slices.SortFunc(gs, func(a, b costGrant) int { return a.slot.Compare(b.slot) })
	for pi, p := range policies {
		grants := make([]guarantee.Grant, len(gs))
		for i, g := range gs {
			grants[i] = guarantee.Grant{At: g.slot, Cost: g.cost[p.Unit]}
		}
		r := guarantee.CheckCosts(grants, guarantee.Limit{Capacity: p.Capacity, RefillAmount: p.RefillAmount, RefillFrequency: p.RefillFrequency}, 0)
		if !r.OK() {
			t.Errorf("policy %d (%q, capacity %d): %v", pi, p.Unit, p.Capacity, r)
		}
	}
	onTime := slices.DeleteFunc(slices.Clone(gs), func(g costGrant) bool { return g.retimed })
	for i := 1; i < len(onTime); i++ {
		if onTime[i].ticket < onTime[i-1].ticket && onTime[i].slot.After(onTime[i-1].slot) {
			t.Errorf("ticket %d got slot %v after ticket %d's %v: overtaken", onTime[i].ticket, onTime[i].slot, onTime[i-1].ticket, onTime[i-1].slot)
		}
	}
	byTicket := slices.Clone(onTime)
	slices.SortFunc(byTicket, func(a, b costGrant) int { return int(a.ticket - b.ticket) })
	for i := 1; i < len(byTicket); i++ {
		if byTicket[i].slot.Before(byTicket[i-1].slot) {
			t.Errorf("ticket %d (cost %v) has slot %v before ticket %d's (cost %v) %v: it overtook",
				byTicket[i].ticket, byTicket[i].cost, byTicket[i].slot, byTicket[i-1].ticket, byTicket[i-1].cost, byTicket[i-1].slot)
			break
		}
	}
	for _, g := range gs {
		if g.start.Before(g.slot.Add(-100 * time.Microsecond)) {
			t.Errorf("a caller started %v before its slot", g.slot.Sub(g.start))
			break
		}
	}
}

// contract is the shape of Sentinel Hub's contract (1,000 requests a
// minute, 1,000 PU a minute, 400,000 PU a month) scaled down to saturate
// within a few seconds: 100 requests and 100 PU of burst at 1,667/s each,
// and 1,000 PU of burst at 1,429/s, so that both PU policies bind.
func contract(name string) bucket.Config {
	return bucket.Config{
		Name:     name,
		Capacity: 100, RefillAmount: 1, RefillFrequency: 600 * time.Microsecond, // requests
		Policies: []bucket.Policy{
			{Unit: "pu", Capacity: 100, RefillAmount: 1, RefillFrequency: 600 * time.Microsecond},
			{Unit: "pu", Capacity: 1000, RefillAmount: 1, RefillFrequency: 700 * time.Microsecond},
		},
	}
}

// TestCostsAcrossBuckets: callers of random costs in several Bucket
// handles (each with its own client, IDs, batchers and scheduler, as
// separate processes have) share one three-policy bucket; every policy
// keeps the guarantee for the sum of costs, and nobody overtakes.
func TestCostsAcrossBuckets(t *testing.T) {
	srv := redistest.New(t)
	cfg := contract(t.Name())
	var mu sync.Mutex
	var gs []costGrant
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	for p := range 3 {
		rdb := srv.Client()
		defer rdb.Close()
		b := newBucket(t, rdb, cfg)
		for c := range 10 {
			rng := rand.New(rand.NewPCG(uint64(p), uint64(c)))
			wg.Go(func() {
				for range 4 {
					cost := bucket.Cost{"": 1, "pu": 1 + rng.IntN(60)}
					rep, err := enterReport(ctx, b, cost)
					if err != nil {
						t.Errorf("EnterCost(%v): %v", cost, err)
						return
					}
					mu.Lock()
					gs = append(gs, costGrant{cost: cost, ticket: rep.Ticket, slot: rep.Slot, start: time.Now(), retimed: rep.Retimes > 0})
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	if len(gs) != 3*10*4 {
		t.Fatalf("%d grants, want %d", len(gs), 3*10*4)
	}
	policies := append([]bucket.Policy{{Capacity: cfg.Capacity, RefillAmount: cfg.RefillAmount, RefillFrequency: cfg.RefillFrequency}}, cfg.Policies...)
	checkCosts(t, gs, policies)
	// The slots span about as long as the binding policy needs for the
	// costs granted, past its burst: it was used to the full.
	first, last := gs[0].slot, gs[0].slot
	units := map[string]int{}
	for _, g := range gs {
		if g.slot.Before(first) {
			first = g.slot
		}
		if g.slot.After(last) {
			last = g.slot
		}
		for u, n := range g.cost {
			units[u] += n
		}
	}
	var ideal time.Duration
	for _, p := range policies {
		ideal = max(ideal, time.Duration(units[p.Unit]-p.Capacity)*p.RefillFrequency/time.Duration(p.RefillAmount))
	}
	if span := last.Sub(first); span > ideal+ideal/10 || span < ideal-ideal/10 {
		t.Errorf("%v granted over %v, the binding policy needs %v: utilization %.2f", units, span, ideal, float64(ideal)/float64(span))
	} else {
		t.Logf("%v granted over %v, the binding policy needs %v: utilization %.3f", units, span, ideal, float64(ideal)/float64(span))
	}
}

// TestCostAboveCapacityRefused: a cost no wait could grant is refused at
// once, naming the policy, and touches nothing in Redis.
func TestCostAboveCapacityRefused(t *testing.T) {
	srv := redistest.New(t)
	rdb := srv.Client()
	defer rdb.Close()
	cfg := contract(t.Name())
	b := newBucket(t, rdb, cfg)
	for _, tc := range []struct {
		cost bucket.Cost
		want string
	}{
		{bucket.Cost{"": 1, "pu": 101}, `101 "pu" above the Capacity 100 of policy 1`},
		{bucket.Cost{"": 101}, "101 calls above the Capacity 100 of policy 0"},
	} {
		start := time.Now()
		err := b.EnterCost(withTimeout(t, 10*time.Second), tc.cost)
		switch {
		case !errors.Is(err, sluice.ErrCostExceedsCapacity):
			t.Errorf("EnterCost(%v) = %v, want sluice.ErrCostExceedsCapacity", tc.cost, err)
		case errors.Is(err, sluice.ErrLimited):
			t.Errorf("EnterCost(%v) = %v matches ErrLimited: callers would retry it", tc.cost, err)
		case !strings.Contains(err.Error(), tc.want):
			t.Errorf("EnterCost(%v) = %q, want it to say %q", tc.cost, err, tc.want)
		case time.Since(start) > time.Second:
			t.Errorf("EnterCost(%v) took %v to refuse", tc.cost, time.Since(start))
		}
	}
	if err := b.EnterN(context.Background(), 101); !errors.Is(err, sluice.ErrCostExceedsCapacity) {
		t.Errorf("EnterN(101) = %v, want sluice.ErrCostExceedsCapacity", err)
	}
	if keys := keysOf(t, rdb, b); len(keys) != 0 {
		t.Errorf("a refused cost left keys %q", keys)
	}
}

// TestZeroAndNegativeCosts: a cost that takes nothing returns at once and
// leaves the policies as they were; negative costs and units no policy
// counts are errors matching sluice.ErrConfig.
func TestZeroAndNegativeCosts(t *testing.T) {
	srv := redistest.New(t)
	rdb := srv.Client()
	defer rdb.Close()
	cfg := bucket.Config{Capacity: 2, RefillAmount: 1, RefillFrequency: time.Hour,
		Policies: []bucket.Policy{{Unit: "pu", Capacity: 5, RefillAmount: 1, RefillFrequency: time.Hour}}}
	b := newBucket(t, rdb, cfg)
	ctx := withTimeout(t, 5*time.Second)
	for _, c := range []bucket.Cost{{}, {"": 0}, {"pu": 0}} {
		if err := b.EnterCost(ctx, c); err != nil {
			t.Errorf("EnterCost(%v) = %v, want nil", c, err)
		}
	}
	if err := b.EnterN(ctx, 0); err != nil {
		t.Errorf("EnterN(0) = %v", err)
	}
	for _, c := range []bucket.Cost{{"": -1}, {"pu": -3}, {"tokens": 1}} {
		if err := b.EnterCost(ctx, c); !errors.Is(err, sluice.ErrConfig) || errors.Is(err, sluice.ErrLimited) {
			t.Errorf("EnterCost(%v) = %v, want an error matching sluice.ErrConfig, not ErrLimited", c, err)
		}
		if _, err := b.Estimate(ctx, c); !errors.Is(err, sluice.ErrConfig) {
			t.Errorf("Estimate(%v) = %v, want an error matching sluice.ErrConfig", c, err)
		}
	}
	// The bucket's Config is a copy: changing its policies changes nothing.
	got := b.Config()
	got.Policies[0].Capacity = 1000
	if b.Config().Policies[0].Capacity != 5 {
		t.Errorf("changing Config().Policies changed the bucket's: %+v", b.Config().Policies)
	}
	// Zero PU leaves the PU policy whole: 5 PU at once, then 2 calls with
	// no PU, all granted at once (capacities 2 calls, 5 PU).
	for _, c := range []bucket.Cost{{"pu": 5}, {"": 1}, {"": 1, "pu": 0}} {
		rep, err := b.EnterReport(ctx, c)
		if err != nil || rep.Position != 0 || rep.Wait > time.Second {
			t.Errorf("EnterCost(%v) = %+v, %v: want granted at once", c, rep, err)
		}
	}
	// A nil cost is Enter's, not nothing: the bucket is out of calls for
	// an hour, so its estimate is that long and a caller bound to a
	// second is refused.
	if est, err := b.Estimate(ctx, nil); err != nil || est.Wait < 50*time.Minute {
		t.Errorf("Estimate(nil) = %+v, %v: want Enter's wait, about an hour", est, err)
	}
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if _, err := b.EnterReport(short, nil); !errors.Is(err, sluice.ErrWaitTooLong) {
		t.Errorf("EnterReport(nil) with a second to live = %v, want ErrWaitTooLong (Enter's cost)", err)
	}
	if err := b.EnterCost(short, nil); !errors.Is(err, sluice.ErrWaitTooLong) {
		t.Errorf("EnterCost(nil) with a second to live = %v, want ErrWaitTooLong (Enter's cost)", err)
	}
}

// TestCancelRefundsCost: a queued caller that gives up gives its whole cost
// back: the next caller gets those tokens at the refill, not a refill later.
func TestCancelRefundsCost(t *testing.T) {
	srv := redistest.New(t)
	rdb := srv.Client()
	defer rdb.Close()
	const every = 600 * time.Millisecond
	cfg := bucket.Config{Capacity: 5, RefillAmount: 5, RefillFrequency: every}
	b := newBucket(t, rdb, cfg)
	ctx := withTimeout(t, 10*time.Second)
	if err := b.EnterN(ctx, 5); err != nil { // empty the bucket
		t.Fatal(err)
	}
	drained := time.Now()
	gone, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- b.EnterN(gone, 5) }()
	waitFor(t, 5*time.Second, "the cost-5 caller to queue", func() bool {
		l, _ := rdb.LLen(ctx, bucket.Keys(b).Queue).Result()
		return l == 1
	})
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled EnterN = %v", err)
	}
	waitFor(t, 5*time.Second, "the cancelled caller to leave the queue", func() bool {
		l, _ := rdb.LLen(ctx, bucket.Keys(b).Queue).Result()
		return l == 0
	})
	rep, err := b.EnterReport(ctx, bucket.Cost{"": 5})
	if err != nil {
		t.Fatal(err)
	}
	// Had the cancelled caller kept its 5 tokens, this one would start at
	// the second refill, 2 × every after the drain.
	if waited := time.Since(drained); waited > every+every/2 {
		t.Errorf("the next cost-5 caller started %v after the drain (report %+v): the cancelled cost was not given back", waited, rep)
	}
	raw, _ := rdb.Get(ctx, bucket.Keys(b).State).Result()
	// done until level anchor format id hold held [costed extra [peaks]]
	if f := strings.Fields(raw); len(f) < 8 || (len(f) > 8 && (f[8] != "0" || f[9] != "0")) {
		t.Errorf("state %q still counts queued costs", raw)
	}
}

// TestHeadCostHoldsBackThoseBehind: FIFO across costs. A cost-10 caller
// at the head waits for its tokens, and a cost-1 caller behind it does not
// overtake it, though a token for it comes sooner.
func TestHeadCostHoldsBackThoseBehind(t *testing.T) {
	srv := redistest.New(t)
	rdb := srv.Client()
	defer rdb.Close()
	cfg := bucket.Config{Capacity: 10, RefillAmount: 1, RefillFrequency: 20 * time.Millisecond}
	b := newBucket(t, rdb, cfg)
	ctx := withTimeout(t, 10*time.Second)
	if err := b.EnterN(ctx, 10); err != nil {
		t.Fatal(err)
	}
	big := make(chan report, 1)
	go func() {
		rep, err := enterReport(ctx, b, bucket.Cost{"": 10})
		if err != nil {
			t.Error(err)
		}
		big <- rep
	}()
	waitFor(t, 5*time.Second, "the cost-10 caller to queue", func() bool {
		l, _ := rdb.LLen(ctx, bucket.Keys(b).Queue).Result()
		return l == 1
	})
	small, err := enterReport(ctx, b)
	if err != nil {
		t.Fatal(err)
	}
	head := <-big
	if small.Slot.Before(head.Slot) || small.Ticket < head.Ticket {
		t.Errorf("cost-1 caller (ticket %d) slot %v before the cost-10 head's (ticket %d) %v: it overtook",
			small.Ticket, small.Slot, head.Ticket, head.Slot)
	}
	if d := small.Slot.Sub(head.Slot); d < 15*time.Millisecond || d > 25*time.Millisecond {
		t.Errorf("cost-1 caller's slot %v after the head's, want one refill (20ms)", d)
	}
}

// TestNewRejectsBadPolicies: each bad policy is named.
func TestNewRejectsBadPolicies(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	ok := bucket.Policy{Unit: "pu", Capacity: 5, RefillAmount: 1, RefillFrequency: time.Second}
	for _, tc := range []struct {
		cfg  bucket.Config
		want string
	}{
		{bucket.Config{Name: "n"}, "Capacity 0"},
		{bucket.Config{Name: "n", Policies: []bucket.Policy{ok, {Unit: "x", Capacity: 0, RefillAmount: 1, RefillFrequency: time.Second}}}, "Policies[1] Capacity 0"},
		{bucket.Config{Name: "n", Policies: []bucket.Policy{{Unit: "a,b", Capacity: 1, RefillAmount: 1, RefillFrequency: time.Second}}}, "comma"},
		{bucket.Config{Name: "n", RefillAmount: 1, Policies: []bucket.Policy{ok}}, "Capacity 0"},
	} {
		_, err := bucket.New(rdb, tc.cfg)
		if !errors.Is(err, sluice.ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%+v) = %v, want ErrConfig saying %q", tc.cfg, err, tc.want)
		}
	}
	// Policies alone are a bucket: Enter takes nothing from a "pu" policy.
	b, err := bucket.New(rdb, bucket.Config{Name: t.Name(), Policies: []bucket.Policy{ok}})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if err := b.EnterCost(withTimeout(t, 5*time.Second), bucket.Cost{"pu": 5}); err != nil {
		t.Fatal(err)
	}
}

// TestStateOfLaterFormatRefused: a state a later version wrote is refused
// with an error that says so, not misread.
func TestStateOfLaterFormatRefused(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	b := newBucket(t, rdb, bucket.Config{Capacity: 5, RefillAmount: 1, RefillFrequency: time.Second})
	ctx := withTimeout(t, 5*time.Second)
	if err := rdb.Set(ctx, bucket.Keys(b).State, "0 0 5 1763769600123457 3 cx", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	err := b.Enter(ctx)
	if err == nil || !strings.Contains(err.Error(), "format 3") || !strings.Contains(err.Error(), "upgrade") {
		t.Fatalf("Enter on a state of format 3 = %v, want an error naming the format", err)
	}
}

// TestEstimateSeesTheQueue: an estimate counts the callers queued ahead
// and their costs, takes nothing, and matches what then happens.
func TestEstimateSeesTheQueue(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	const every = 300 * time.Millisecond
	b := newBucket(t, rdb, bucket.Config{Capacity: 5, RefillAmount: 5, RefillFrequency: every})
	ctx := withTimeout(t, 10*time.Second)
	if e, err := b.Estimate(ctx, bucket.Cost{"": 5}); err != nil || e.Wait != 0 || e.Ahead != 0 {
		t.Fatalf("estimate on a full bucket = %+v, %v; want no wait", e, err)
	}
	if err := b.EnterN(ctx, 5); err != nil { // empty it
		t.Fatal(err)
	}
	errc := make(chan error, 2)
	for range 2 { // two cost-5 callers: the next two refills are theirs
		go func() { errc <- b.EnterN(ctx, 5) }()
	}
	waitFor(t, 5*time.Second, "two callers to queue", func() bool {
		l, _ := rdb.LLen(ctx, bucket.Keys(b).Queue).Result()
		return l == 2
	})
	before, err := rdb.Time(ctx).Result() // the Redis clock, around the estimate's
	if err != nil {
		t.Fatal(err)
	}
	est, err := b.Estimate(ctx, bucket.Cost{"": 5})
	if err != nil {
		t.Fatal(err)
	}
	after, err := rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	// A new bucket's refills start up to 5 ms late (state.lua's load).
	if est.Ahead != 2 || est.Wait < 2*every || est.Wait > 3*every+5*time.Millisecond {
		t.Fatalf("estimate behind two cost-5 callers = %+v, want 2 ahead and a wait of about 3 refills less the time since the drain", est)
	}
	if l, _ := rdb.LLen(ctx, bucket.Keys(b).Queue).Result(); l != 2 {
		t.Fatalf("the estimate changed the queue: %d queued", l)
	}
	// The slot it then gets, on the Redis clock, is the one estimated
	// (nobody ahead left): the estimate's now plus its wait.
	// A caller that came later than MaxLateness for it (a starved
	// test process) is retimed: its grant moves to when it came.
	var d enterdetail.Detail
	rep, err := b.EnterReport(enterdetail.With(ctx, &d), bucket.Cost{"": 5})
	if err != nil {
		t.Fatal(err)
	}
	lo, hi := before.Add(est.Wait-time.Microsecond), after.Add(est.Wait+time.Microsecond)
	if rep.Retimes > 0 {
		t.Logf("the caller came late for its slot and was retimed (%+v): its slot is not the estimate's", rep)
	} else if d.Slot.Before(lo) || d.Slot.After(hi) {
		t.Errorf("estimated a wait of %v between %v and %v (Redis clock), so a slot in [%v, %v]; got %v", est.Wait, before, after, lo, hi, d.Slot)
	}
	for range 2 {
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}
	if _, err := b.Estimate(ctx, bucket.Cost{"": 6}); !errors.Is(err, sluice.ErrCostExceedsCapacity) {
		t.Errorf("estimate of an impossible cost = %v", err)
	}
}

func TestRate(t *testing.T) {
	for _, tc := range []struct {
		n      int
		period time.Duration
		burst  int
		want   bucket.Policy
	}{
		{20, time.Second, 5, bucket.Policy{Capacity: 5, RefillAmount: 1, RefillFrequency: 50 * time.Millisecond}},
		{1000, time.Minute, 1000, bucket.Policy{Capacity: 1000, RefillAmount: 1, RefillFrequency: 60 * time.Millisecond}},
		{400000, 31 * 24 * time.Hour, 400000, bucket.Policy{Capacity: 400000, RefillAmount: 1, RefillFrequency: 6696 * time.Millisecond}},
		{100, 3 * time.Microsecond, 100, bucket.Policy{Capacity: 100, RefillAmount: 100, RefillFrequency: 3 * time.Microsecond}},
		// 3 a second is not a whole number of µs apart: exact as 3 every
		// second with a burst of 3; with a burst of 1, a little slower.
		{3, time.Second, 3, bucket.Policy{Capacity: 3, RefillAmount: 3, RefillFrequency: time.Second}},
		{3, time.Second, 1, bucket.Policy{Capacity: 1, RefillAmount: 1, RefillFrequency: 333334 * time.Microsecond}},
	} {
		if got := bucket.Rate(tc.n, tc.period, tc.burst); got != tc.want {
			t.Errorf("Rate(%d, %v, %d) = %+v, want %+v", tc.n, tc.period, tc.burst, got, tc.want)
		}
	}
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	for _, tc := range []struct {
		p     bucket.Policy
		words string
	}{
		{bucket.Rate(0, time.Second, 5), "n"},
		{bucket.Rate(20, time.Second, 0), "the burst"},
		{bucket.Rate(20, 0, 5), "the period"},
	} {
		// A user who wrote Rate learns which of its arguments is wrong.
		_, err := bucket.New(rdb, bucket.Config{Name: "n", Policies: []bucket.Policy{tc.p}})
		if !errors.Is(err, sluice.ErrConfig) || !strings.Contains(err.Error(), "Rate(n, period, burst): "+tc.words+")") {
			t.Errorf("New with %+v: %v, want ErrConfig naming Rate's %s", tc.p, err, tc.words)
		}
	}
}

// TestCostsAcrossProcesses: worker processes (this test binary re-executed)
// enter one three-policy bucket with random PU costs; all grants together
// keep every policy's guarantee, in ticket order.
func TestCostsAcrossProcesses(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	cfg := contract(t.Name())
	var procs []*loadgen.Proc
	for i := range 3 {
		procs = append(procs, startWorker(t, loadgen.Spec{Proc: i, Addr: srv.Addr(), Bucket: cfg, Callers: 10, Enters: 4,
			CostUnit: "pu", CostMin: 1, CostMax: 60}))
	}
	var gs []costGrant
	for _, p := range procs {
		for _, g := range wait(t, p) {
			if !g.OK() {
				t.Errorf("proc %d caller %d: %s", g.Proc, g.Caller, g.Err)
				continue
			}
			if g.Cost < 1 || g.Cost > 60 {
				t.Fatalf("a grant of cost %d", g.Cost)
			}
			gs = append(gs, costGrant{cost: bucket.Cost{"": 1, "pu": g.Cost}, ticket: g.Ticket, slot: g.SlotTime(), start: g.Time(), retimed: g.Retimes > 0})
		}
	}
	if len(gs) != 3*10*4 {
		t.Fatalf("%d grants, want %d", len(gs), 3*10*4)
	}
	checkCosts(t, gs, append([]bucket.Policy{{Capacity: cfg.Capacity, RefillAmount: cfg.RefillAmount, RefillFrequency: cfg.RefillFrequency}}, cfg.Policies...))
}

// TestMaxWaitCountsCostsAhead: MaxWait judges a caller's wait from the
// costs of the callers ahead of it and its own, not from their number;
// MaxQueue counts callers, whatever their cost.
func TestMaxWaitCountsCostsAhead(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	const every = 100 * time.Millisecond
	b := newBucket(t, rdb, bucket.Config{Capacity: 10, RefillAmount: 1, RefillFrequency: every, MaxWait: 10 * every, MaxQueue: 2})
	ctx := withTimeout(t, 10*time.Second)
	if err := b.EnterN(ctx, 10); err != nil { // empty it
		t.Fatal(err)
	}
	errc := make(chan error, 2)
	go func() { errc <- b.EnterN(ctx, 8) }() // 8 refills ahead of the next caller
	waitFor(t, 5*time.Second, "the cost-8 caller to queue", func() bool {
		l, _ := rdb.LLen(ctx, bucket.Keys(b).Queue).Result()
		return l == 1
	})
	// Behind 8 refills, a cost of 4 waits about 12 refills: above MaxWait
	// (a count of callers would see one ahead and let it in).
	if err := b.EnterN(ctx, 4); !errors.Is(err, sluice.ErrWaitTooLong) || !errors.Is(err, sluice.ErrLimited) {
		t.Fatalf("cost 4 behind a cost 8 with MaxWait of 10 refills: %v, want sluice.ErrWaitTooLong", err)
	}
	// A cost of 1 waits about 9 refills: within MaxWait.
	go func() { errc <- b.EnterN(ctx, 1) }()
	waitFor(t, 5*time.Second, "the cost-1 caller to queue", func() bool {
		l, _ := rdb.LLen(ctx, bucket.Keys(b).Queue).Result()
		return l == 2
	})
	// Two callers wait: MaxQueue refuses a third whatever its cost.
	if err := b.EnterN(ctx, 1); !errors.Is(err, sluice.ErrQueueFull) {
		t.Fatalf("a third caller with MaxQueue 2: %v, want sluice.ErrQueueFull", err)
	}
	for range 2 {
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}
}
