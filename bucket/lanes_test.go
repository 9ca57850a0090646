package bucket_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/enterdetail"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/internal/testing/testkit"
)

// laneLoad is one lane's callers in a lanes test: Callers goroutines
// looping on Enter in Lane (cost Cost in "pu" when set) until the test
// ends.
type laneLoad struct {
	Lane    string
	Callers int
	Cost    int
}

// runLanes runs loads on one bucket of cfg in one process for d, and
// returns the grants' slots (Redis clock) and costs per lane; bent holds
// the slots of the grants retimed or claimed (a late caller's, whose
// order is not the step's: design.md, "Overload").
func runLanes(t *testing.T, b *bucket.Bucket, d time.Duration, loads ...laneLoad) (gs map[string][]guarantee.Grant, bent map[time.Time]bool) {
	t.Helper()
	// Cancelled, not a deadline: a deadline would refuse the callers whose
	// turn comes after it (sluice.ErrWaitTooLong).
	ctx, cancel := context.WithCancel(context.Background())
	defer time.AfterFunc(d, cancel).Stop()
	var mu sync.Mutex
	out := map[string][]guarantee.Grant{}
	bent = map[time.Time]bool{}
	polls := map[string]int{}
	defer func() { t.Logf("polls per grant: %v", perGrant(polls, out)) }()
	var wg sync.WaitGroup
	for i, l := range loads {
		spec := loadgen.Spec{Proc: i, Callers: l.Callers, Lane: l.Lane}
		if l.Cost > 0 {
			spec.CostUnit, spec.CostMin, spec.CostMax = "pu", l.Cost, l.Cost
		}
		wg.Go(func() {
			loadgen.Run(ctx, b, spec, func(g loadgen.Grant) {
				if g.Err != "" {
					if ctx.Err() == nil {
						t.Errorf("lane %s: %s", l.Lane, g.Err)
					}
					return
				}
				mu.Lock()
				out[l.Lane] = append(out[l.Lane], guarantee.Grant{At: g.SlotTime(), Cost: max(g.Cost, 1)})
				polls[l.Lane] += g.Polls
				if g.Retimes > 0 || g.Claims > 0 {
					bent[g.SlotTime()] = true
				}
				mu.Unlock()
			})
		})
	}
	wg.Wait()
	return out, bent
}

// perGrant is each lane's polls per grant.
func perGrant(polls map[string]int, gs map[string][]guarantee.Grant) map[string]string {
	out := map[string]string{}
	for lane, n := range polls {
		out[lane] = fmt.Sprintf("%.2f", float64(n)/float64(max(len(gs[lane]), 1)))
	}
	return out
}

// unitsBetween sums the costs of gs whose slot lies in [from, to).
func unitsBetween(gs []guarantee.Grant, from, to time.Time) int {
	n := 0
	for _, g := range gs {
		if !g.At.Before(from) && g.At.Before(to) {
			n += g.Cost
		}
	}
	return n
}

// TestLanesFairShare: three lanes saturating one bucket, in one process,
// each get their weight's share of the grants (±5 %).
func TestLanesFairShare(t *testing.T) {
	srv := redistest.New(t)
	cfg := bucket.Config{Capacity: 20, RefillAmount: 1, RefillFrequency: 5 * time.Millisecond,
		Lanes: []bucket.Lane{{Name: "c", Weight: 2}}}
	b := newBucket(t, srv.Client(), cfg)
	gs, _ := runLanes(t, b, 4*time.Second, laneLoad{Lane: "a", Callers: 100}, laneLoad{Lane: "b", Callers: 20}, laneLoad{Lane: "c", Callers: 50})
	var all []time.Time
	var first time.Time
	for _, g := range gs {
		for _, x := range g {
			all = append(all, x.At)
			if first.IsZero() || x.At.Before(first) {
				first = x.At
			}
		}
	}
	if r := guarantee.Check(all, limitOf(cfg)); !r.OK() {
		t.Fatalf("limit broken: %v", r)
	}
	from, to := first.Add(time.Second), first.Add(3*time.Second)
	total := 0
	got := map[string]int{}
	for lane, g := range gs {
		got[lane] = unitsBetween(g, from, to)
		total += got[lane]
	}
	// The rate used is the bench's to judge (cmd/bench --scenario lanes)
	// and TestLanesAcrossProcesses's: in one process beside a busy loop,
	// late wake-ups lose a few tokens with or without lanes (measured:
	// 345-400 of 400 without lanes, 390-398 with them).
	t.Logf("grants in 2 s: %v (total %d of 400)", got, total)
	for lane, w := range map[string]float64{"a": 0.25, "b": 0.25, "c": 0.5} {
		if share := float64(got[lane]) / float64(total); share < w-0.05 || share > w+0.05 {
			t.Errorf("lane %s: share %.3f, want %.2f ± 0.05", lane, share, w)
		}
	}
}

// slotOrder returns every grant of gs, each with its lane, in slot order.
func slotOrder(gs map[string][]guarantee.Grant) []laneGrant {
	var all []laneGrant
	for lane, g := range gs {
		for _, x := range g {
			all = append(all, laneGrant{lane, x})
		}
	}
	slices.SortFunc(all, func(a, b laneGrant) int { return a.At.Compare(b.At) })
	return all
}

type laneGrant struct {
	lane string
	guarantee.Grant
}

// TestLanesPriorityFloor: a lane of priority 1 saturating the bucket is
// served first, and a lane of priority 0 saturating it too keeps its
// floor: 1 grant in 16 (LANE_FLOOR), never more than 16 grants of the
// higher lane between two of its own, judged on the slots (Redis clock)
// that the step gave in its order.
func TestLanesPriorityFloor(t *testing.T) {
	srv := redistest.New(t)
	cfg := bucket.Config{Capacity: 20, RefillAmount: 1, RefillFrequency: 5 * time.Millisecond,
		Lanes: []bucket.Lane{{Name: "high", Priority: 1}}}
	b := newBucket(t, srv.Client(), cfg)
	gs, bent := runLanes(t, b, 3*time.Second, laneLoad{Lane: "high", Callers: 50}, laneLoad{Lane: "low", Callers: 50})
	all := slotOrder(gs)
	var slots []time.Time
	for _, g := range all {
		slots = append(slots, g.At)
	}
	if r := guarantee.Check(slots, limitOf(cfg)); !r.OK() {
		t.Fatalf("limit broken: %v", r)
	}
	// The steady part: from the 100th grant to 100 before the end.
	if len(all) < 400 {
		t.Fatalf("%d grants in 3 s, want ≥ 400", len(all))
	}
	steady := all[100 : len(all)-100]
	low, run, longest, bends := 0, 0, 0, 0
	for _, g := range steady {
		if g.lane == "low" {
			low++
		}
		if g.lane == "low" || bent[g.At] {
			// A retimed or claiming grant (a caller late for its slot,
			// on a loaded host) takes its slot out of the step's order:
			// runs are judged between them.
			if bent[g.At] {
				bends++
			}
			run = 0
			continue
		}
		run++
		longest = max(longest, run)
	}
	share := float64(low) / float64(len(steady))
	t.Logf("%d steady grants, low %d (%.3f), longest run of high %d; %d retimed or claiming", len(steady), low, share, longest, bends)
	if share < 0.05 || share > 0.075 {
		t.Errorf("low lane's share %.3f, want its floor 1/16 = 0.0625 (± 0.0125)", share)
	}
	if longest > 16 {
		t.Errorf("%d grants of the high lane in a row, want ≤ 16 (the floor)", longest)
	}
}

// TestLanesInteractive: a light lane of priority 1 (5 calls a second)
// beside a saturating one is served next: at most the slots already
// given within the lookahead, and one more, pass before it (judged on
// the slots, Redis clock). The batch gets the rest of the rate: the
// bench judges that (cmd/bench --scenario lanes), on a quiet host.
func TestLanesInteractive(t *testing.T) {
	srv := redistest.New(t)
	// Lookahead's default, with a lane of a priority: one refill (5 ms).
	cfg := bucket.Config{Capacity: 20, RefillAmount: 1, RefillFrequency: 5 * time.Millisecond,
		Lanes: []bucket.Lane{{Name: "interactive", Priority: 1}}}
	b := newBucket(t, srv.Client(), cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var batch map[string][]guarantee.Grant
	var bent map[time.Time]bool
	done := make(chan struct{})
	go func() {
		defer close(done)
		batch, bent = runLanes(t, b, 3*time.Second, laneLoad{Lane: "batch", Callers: 100})
	}()
	type call struct{ arrived, slot time.Time }
	var calls []call
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for range 12 {
		<-tick.C
		var d enterdetail.Detail
		if err := b.Enter(enterdetail.With(bucket.WithLane(ctx, "interactive"), &d)); err != nil {
			t.Fatal(err)
		}
		calls = append(calls, call{d.Arrived, d.Slot})
	}
	<-done
	batchSlots := slotOrder(batch)
	perPeriod := 1                // the default Lookahead's slots: one refill
	for i, c := range calls[2:] { // the batch saturates by then
		ahead := 0
		for _, g := range batchSlots {
			if g.At.After(c.arrived) && g.At.Before(c.slot) && !bent[g.At] { // a late caller's: not the step's order
				ahead++
			}
		}
		if ahead > perPeriod+2 {
			t.Errorf("interactive call %d: %d batch grants between its arrival and its slot (%v), want ≤ %d (the lookahead's, and two)", i+2, ahead, c.slot.Sub(c.arrived), perPeriod+2)
		}
	}
	if len(batchSlots) == 0 {
		t.Fatal("no batch grants")
	}
}

// TestLanesCountCosts: shares are counted in the unit of the first
// policy: a lane whose calls cost 60 and one whose calls cost 20, of equal
// weights, each get half the units, so the second three times the calls.
func TestLanesCountCosts(t *testing.T) {
	srv := redistest.New(t)
	cfg := bucket.Config{Policies: []bucket.Policy{
		{Unit: "pu", Capacity: 600, RefillAmount: 60, RefillFrequency: 10 * time.Millisecond},
		{Capacity: 1000, RefillAmount: 1000, RefillFrequency: time.Second},
	}}
	b := newBucket(t, srv.Client(), cfg)
	gs, _ := runLanes(t, b, 3*time.Second, laneLoad{Lane: "big", Callers: 30, Cost: 60}, laneLoad{Lane: "small", Callers: 30, Cost: 20})
	all := slotOrder(gs)
	var grants []guarantee.Grant
	for _, g := range all {
		grants = append(grants, g.Grant)
	}
	limit := guarantee.Limit{Capacity: 600, RefillAmount: 60, RefillFrequency: 10 * time.Millisecond}
	if r := guarantee.CheckCosts(grants, limit, 0); !r.OK() {
		t.Fatalf("limit broken: %v", r)
	}
	from, to := all[0].At.Add(time.Second), all[0].At.Add(2500*time.Millisecond)
	big, small := unitsBetween(gs["big"], from, to), unitsBetween(gs["small"], from, to)
	share := float64(big) / float64(big+small)
	t.Logf("in 1.5 s: big %d units, small %d units (%d calls), big's share %.3f", big, small, small/20, share)
	if share < 0.45 || share > 0.55 {
		t.Errorf("big lane's share of the units %.3f, want 0.5 ± 0.05", share)
	}
	if want := 6000 * 15 / 10; big+small < want*97/100 {
		t.Errorf("%d units in 1.5 s, want ≥ 97 %% of %d", big+small, want)
	}
}

// TestLanesBadInput: bad lanes are refused at New, or by the call, which
// then queues nothing.
func TestLanesBadInput(t *testing.T) {
	srv := redistest.New(t)
	rdb := srv.Client()
	long := strings.Repeat("x", 129)
	for _, c := range []struct {
		lanes []bucket.Lane
		want  string
	}{
		{[]bucket.Lane{{Name: ""}}, "lane name is empty"},
		{[]bucket.Lane{{Name: long}}, "more than 128"},
		{[]bucket.Lane{{Name: "a b"}}, "space"},
		{[]bucket.Lane{{Name: "a|b"}}, "'|'"},
		{[]bucket.Lane{{Name: "a", Weight: -1}}, "Weight -1"},
		{[]bucket.Lane{{Name: "a", Priority: -1}}, "Priority -1"},
		{[]bucket.Lane{{Name: "a"}, {Name: "a", Weight: 2}}, "listed twice"},
	} {
		_, err := bucket.New(rdb, bucket.Config{Name: t.Name(), Capacity: 1, RefillAmount: 1, RefillFrequency: time.Second, Lanes: c.lanes})
		if !errors.Is(err, sluice.ErrConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Lanes %+v: %v, want ErrConfig saying %q", c.lanes, err, c.want)
		}
	}
	cfg := bucket.Config{Capacity: 1, RefillAmount: 1, RefillFrequency: time.Hour}
	b := newBucket(t, rdb, cfg)
	if err := b.Enter(context.Background()); err != nil { // the token: later callers would queue
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, name := range []string{"", long, "tab\there"} {
		err := b.Enter(bucket.WithLane(ctx, name))
		if !errors.Is(err, sluice.ErrConfig) || !strings.Contains(err.Error(), "WithLane") {
			t.Errorf("WithLane(%.10q): %v, want ErrConfig from WithLane", name, err)
		}
		if _, err := b.Estimate(bucket.WithLane(ctx, name), nil); !errors.Is(err, sluice.ErrConfig) {
			t.Errorf("Estimate, WithLane(%.10q): %v, want ErrConfig", name, err)
		}
	}
	if keys, err := rdb.Keys(ctx, "sluice:{"+t.Name()+"}:lane*").Result(); err != nil || len(keys) > 0 {
		t.Errorf("lane keys %v (%v), want none: nothing queued", keys, err)
	}
	if est, err := b.Estimate(ctx, nil); err != nil || est.Ahead != 0 {
		t.Errorf("Estimate %+v (%v), want nobody ahead", est, err)
	}
}

// TestLanesAcrossProcesses: three processes, one lane each (c of weight
// 2), share the bucket by weight (±5 %), every grant within the limit;
// when c's callers stop, a and b take its share at once
// (work-conserving), half each.
func TestLanesAcrossProcesses(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	cfg, err := bucketConfig(t.Name(), 20, 1, 5*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Lanes = []bucket.Lane{{Name: "c", Weight: 2}}
	start := time.Now().Add(time.Second).UnixNano()
	until := map[string]time.Duration{"a": 3 * time.Second, "b": 3 * time.Second, "c": 1500 * time.Millisecond}
	var procs []*loadgen.Proc
	for i, lane := range []string{"a", "b", "c"} {
		procs = append(procs, startWorker(t, loadgen.Spec{Proc: i, Addr: srv.Addr(), Bucket: cfg, Callers: 30, Until: until[lane], StartAt: start, Lane: lane}))
	}
	gs := map[string][]guarantee.Grant{}
	var all []loadgen.Grant
	for i, p := range procs {
		for _, g := range wait(t, p) {
			if g.Err != "" {
				t.Fatalf("proc %d: %s", i, g.Err)
			}
			all = append(all, g)
			lane := []string{"a", "b", "c"}[g.Proc]
			gs[lane] = append(gs[lane], guarantee.Grant{At: g.SlotTime(), Cost: 1})
		}
	}
	checkGrants(t, all, cfg)
	t0 := time.Unix(0, start)
	shares := func(from, to time.Time) (map[string]int, int) {
		got, total := map[string]int{}, 0
		for lane, g := range gs {
			got[lane] = unitsBetween(g, from, to)
			total += got[lane]
		}
		return got, total
	}
	got, total := shares(t0.Add(400*time.Millisecond), t0.Add(1400*time.Millisecond))
	t.Logf("all three lanes, 1 s: %v", got)
	for lane, w := range map[string]float64{"a": 0.25, "b": 0.25, "c": 0.5} {
		if s := float64(got[lane]) / float64(total); s < w-0.05 || s > w+0.05 {
			t.Errorf("lane %s: share %.3f of %d, want %.2f ± 0.05", lane, s, total, w)
		}
	}
	if total < 200*98/100 {
		t.Errorf("%d grants in 1 s, want ≥ 98 %% of 200", total)
	}
	cEnd := slotOrder(map[string][]guarantee.Grant{"c": gs["c"]})
	last := cEnd[len(cEnd)-1].At
	got, total = shares(last.Add(100*time.Millisecond), t0.Add(2800*time.Millisecond))
	span := t0.Add(2800 * time.Millisecond).Sub(last.Add(100 * time.Millisecond))
	want := int(span / cfg.RefillFrequency)
	t.Logf("after c stopped (its last slot %v after the start), %v: %v", last.Sub(t0), span, got)
	if total < want*98/100 {
		t.Errorf("a and b took %d grants in %v after c stopped, want ≥ 98 %% of %d", total, span, want)
	}
	if s := float64(got["a"]) / float64(total); s < 0.45 || s > 0.55 {
		t.Errorf("after c stopped, a's share %.3f, want 0.5 ± 0.05", s)
	}
}

// TestLanesDeadlineJudgesItsLane: a deep queue in the default lane (about
// a second of callers) does not refuse a caller with a 200 ms deadline
// in another lane, neither here (the back this process learned is the
// default lane's) nor in Redis: its own lane is empty, and it is served
// within its share, in time.
func TestLanesDeadlineJudgesItsLane(t *testing.T) {
	srv := redistest.New(t)
	cfg := bucket.Config{Capacity: 1, RefillAmount: 1, RefillFrequency: 5 * time.Millisecond,
		Lanes: []bucket.Lane{{Name: "interactive", Priority: 1}}}
	b := newBucket(t, srv.Client(), cfg)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for range 200 {
		wg.Go(func() { _ = b.Enter(ctx) })
	}
	testkit.WaitFor(t, 10*time.Second, "the default lane a second deep", func() bool {
		est, err := b.Estimate(ctx, nil)
		return err == nil && est.Wait > 500*time.Millisecond
	})
	// A caller of the default lane with the same deadline is refused.
	dctx, dcancel := context.WithTimeout(ctx, 200*time.Millisecond)
	err := b.Enter(dctx)
	dcancel()
	if !errors.Is(err, sluice.ErrWaitTooLong) {
		t.Errorf("default lane, 200 ms deadline: %v, want ErrWaitTooLong", err)
	}
	for _, lane := range []string{"interactive", "tenant-7"} {
		lctx, lcancel := context.WithTimeout(bucket.WithLane(ctx, lane), 200*time.Millisecond)
		err := b.Enter(lctx)
		lcancel()
		if err != nil {
			t.Errorf("lane %s, 200 ms deadline, behind a default lane a second deep: %v", lane, err)
		}
	}
}

// TestLanesNewcomersDoNotOvertake: 50 callers that each take a new lane
// for every call (a new tenant each time, its name sorting before "zz")
// saturate the bucket; a caller of lane "zz" arriving then is served
// within two rounds: at most the 50 lanes already waiting, the 50 that
// come before their round ends (their tags tie with its own, and ties go
// by name), and the slots already given pass it (judged on the slots,
// Redis clock). Without finish tags that grow, lanes arriving after it
// would tie with it for ever, and win by name.
func TestLanesNewcomersDoNotOvertake(t *testing.T) {
	srv := redistest.New(t)
	cfg := bucket.Config{Capacity: 1, RefillAmount: 1, RefillFrequency: 2 * time.Millisecond, Lookahead: 10 * time.Millisecond}
	b := newBucket(t, srv.Client(), cfg)
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var slots []time.Time
	var seq atomic.Int64
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	for range 50 {
		wg.Go(func() {
			for ctx.Err() == nil {
				var d enterdetail.Detail
				lctx := enterdetail.With(bucket.WithLane(ctx, fmt.Sprintf("a%06d", seq.Add(1))), &d)
				if err := b.Enter(lctx); err != nil {
					return
				}
				mu.Lock()
				slots = append(slots, d.Slot)
				mu.Unlock()
			}
		})
	}
	testkit.WaitFor(t, 10*time.Second, "the bucket saturated", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(slots) > 200
	})
	var d enterdetail.Detail
	if err := b.Enter(enterdetail.With(bucket.WithLane(ctx, "zz"), &d)); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, "the grants around its slot", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(slots) > 0 && slots[len(slots)-1].After(d.Slot)
	})
	cancel()
	mu.Lock()
	defer mu.Unlock()
	passed := 0
	for _, s := range slots {
		if s.After(d.Arrived) && s.Before(d.Slot) {
			passed++
		}
	}
	bound := 2*50 + int(cfg.Lookahead/cfg.RefillFrequency) + 1
	t.Logf("%d grants between its arrival and its slot (%v)", passed, d.Slot.Sub(d.Arrived))
	if passed > bound {
		t.Errorf("%d grants passed lane zz, want ≤ %d (two rounds, and the slots already given)", passed, bound)
	}
}
