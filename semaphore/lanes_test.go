package semaphore

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
)

// laneLoad is one lane's callers in a lanes test: Callers goroutines
// looping on AcquireN(Weight) in Lane ("": the default lane), releasing
// at once, until the test ends.
type laneLoad struct {
	Lane    string
	Callers int
	Weight  int // the permits' weight; 0 means 1
}

// laneGrant is one permit a lanes test was granted: its lane and weight,
// and when Acquire returned and Release was called (this process's
// clock).
type laneGrant struct {
	lane       string
	weight     int
	start, end time.Time
}

// runLanes runs loads on s for d and returns every grant, in the order
// Acquire returned.
func runLanes(t *testing.T, s *Semaphore, d time.Duration, loads ...laneLoad) []laneGrant {
	t.Helper()
	// Cancelled, not a deadline: a waiter's ctx ending is its own error.
	ctx, cancel := context.WithCancel(context.Background())
	defer time.AfterFunc(d, cancel).Stop()
	var mu sync.Mutex
	var out []laneGrant
	var wg sync.WaitGroup
	for _, l := range loads {
		lctx, n := ctx, max(l.Weight, 1)
		if l.Lane != "" {
			lctx = WithLane(ctx, l.Lane)
		}
		for range l.Callers {
			wg.Go(func() {
				for {
					p, err := s.AcquireN(lctx, n)
					if err != nil {
						if ctx.Err() == nil {
							t.Errorf("lane %s: %v", l.Lane, err)
						}
						return
					}
					g := laneGrant{lane: l.Lane, weight: n, start: time.Now()}
					g.end = time.Now()
					if err := p.Release(context.Background()); err != nil {
						t.Errorf("lane %s: Release: %v", l.Lane, err)
					}
					mu.Lock()
					out = append(out, g)
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	slices.SortFunc(out, func(a, b laneGrant) int { return a.start.Compare(b.start) })
	return out
}

// permitsBetween sums the weights granted to each lane whose grant lies
// in [from, to), and their total.
func permitsBetween(gs []laneGrant, from, to time.Time) (map[string]int, int) {
	got, total := map[string]int{}, 0
	for _, g := range gs {
		if !g.start.Before(from) && g.start.Before(to) {
			got[g.lane] += g.weight
			total += g.weight
		}
	}
	return got, total
}

// checkShares fails t unless each lane of want got its share of the
// permits in got, within 5 % of that share.
func checkShares(t *testing.T, got map[string]int, total int, want map[string]float64) {
	t.Helper()
	for lane, w := range want {
		share := float64(got[lane]) / float64(total)
		if share < w*0.95 || share > w*1.05 {
			t.Errorf("lane %s: share %.4f of %d permits, want %.4f ± 5 %%", lane, share, total, w)
		}
	}
}

// checkBound fails t if more than capacity permits were held at once.
func checkBound(t *testing.T, gs []laneGrant, capacity int) {
	t.Helper()
	ivs := make([]interval, 0, len(gs))
	for _, g := range gs {
		for range g.weight {
			ivs = append(ivs, interval{g.start.UnixNano(), g.end.UnixNano()})
		}
	}
	if peak, violations := maxOverlap(ivs, capacity); violations > 0 {
		t.Fatalf("%d acquisitions above capacity %d (peak %d)", violations, capacity, peak)
	}
}

// TestLanesFairShare: three lanes, each with more waiters than permits,
// share the permits by weight (a and b 1, c 2) within 5 % of each share,
// in one process; capacity is never exceeded.
func TestLanesFairShare(t *testing.T) {
	e := newEnv(t)
	const capacity = 4
	s := e.sem(t, Config{Name: t.Name(), Capacity: capacity, Lanes: []sluice.Lane{{Name: "c", Weight: 2}}})
	gs := runLanes(t, s, 3*time.Second,
		laneLoad{Lane: "a", Callers: 8}, laneLoad{Lane: "b", Callers: 8}, laneLoad{Lane: "c", Callers: 8})
	checkBound(t, gs, capacity)
	if len(gs) < 1000 {
		t.Fatalf("%d grants in 3 s, want ≥ 1000 for a steady window", len(gs))
	}
	from := gs[0].start.Add(500 * time.Millisecond)
	got, total := permitsBetween(gs, from, from.Add(2*time.Second))
	t.Logf("permits in 2 s: %v (total %d)", got, total)
	checkShares(t, got, total, map[string]float64{"a": 0.25, "b": 0.25, "c": 0.5})
}

// TestLanesCountPermits: shares are counted in permits: a lane of waiters
// of weight 3 and one of weight 1, of equal lane weights, each get half
// the permits, so the second three times the grants.
func TestLanesCountPermits(t *testing.T) {
	e := newEnv(t)
	const capacity = 6
	s := e.sem(t, Config{Name: t.Name(), Capacity: capacity})
	gs := runLanes(t, s, 3*time.Second, laneLoad{Lane: "heavy", Callers: 6, Weight: 3}, laneLoad{Lane: "light", Callers: 12})
	checkBound(t, gs, capacity)
	from := gs[0].start.Add(500 * time.Millisecond)
	got, total := permitsBetween(gs, from, from.Add(2*time.Second))
	t.Logf("permits in 2 s: %v (total %d; heavy %d grants)", got, total, got["heavy"]/3)
	if total < 1000 {
		t.Fatalf("%d permits in 2 s, want ≥ 1000", total)
	}
	checkShares(t, got, total, map[string]float64{"heavy": 0.5, "light": 0.5})
}

// TestLanesPriorityFloor: with one permit, a lane of priority 1 that
// always has waiters is served first, and a lane of priority 0 that
// always has waiters keeps its floor: 1 grant in 16, never more than 15
// grants of the higher lane between two of its own. With one permit the
// order Acquire returns in is the order Redis granted in.
func TestLanesPriorityFloor(t *testing.T) {
	e := newEnv(t)
	s := e.sem(t, Config{Name: t.Name(), Capacity: 1, Lanes: []sluice.Lane{{Name: "high", Priority: 1}}})
	gs := runLanes(t, s, 3*time.Second, laneLoad{Lane: "high", Callers: 8}, laneLoad{Lane: "low", Callers: 8})
	checkBound(t, gs, 1)
	if len(gs) < 800 {
		t.Fatalf("%d grants in 3 s, want ≥ 800", len(gs))
	}
	steady := gs[200 : len(gs)-200]
	low, run, longest := 0, 0, 0
	for _, g := range steady {
		if g.lane == "low" {
			low++
			run = 0
			continue
		}
		run++
		longest = max(longest, run)
	}
	share := float64(low) / float64(len(steady))
	t.Logf("%d steady grants, low %d (%.4f), longest run of high %d", len(steady), low, share, longest)
	if share < 1.0/16*0.95 || share > 1.0/16*1.05 {
		t.Errorf("low lane's share %.4f, want its floor 1/16 = 0.0625 ± 5 %%", share)
	}
	if longest > 15 {
		t.Errorf("%d grants of the high lane in a row, want ≤ 15 (the floor)", longest)
	}
}

// TestLanesInteractive: with one permit and a lane of priority 0
// saturating it (16 waiters), a caller of a lane of priority 1 is served
// next: at most 3 grants of the low lane pass between its Acquire and
// its grant (one granted before its arrival reached Redis, one in the
// exchange that carries its arrival, whose grants come before arrivals,
// and the floor's), where arrival order would put 16 before it.
func TestLanesInteractive(t *testing.T) {
	e := newEnv(t)
	s := e.sem(t, Config{Name: t.Name(), Capacity: 1, Lanes: []sluice.Lane{{Name: "interactive", Priority: 1}}})
	var batch []laneGrant
	done := make(chan struct{})
	go func() {
		defer close(done)
		batch = runLanes(t, s, 2*time.Second, laneLoad{Lane: "batch", Callers: 16})
	}()
	ctx := WithLane(context.Background(), "interactive")
	waitFor(t, 2*time.Second, "the batch to queue", func() bool {
		return laneLen(t, s, "batch") >= 10
	})
	type call struct{ called, granted time.Time }
	var calls []call
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for range 20 {
		<-tick.C
		called := time.Now()
		p, err := s.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		calls = append(calls, call{called, time.Now()})
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	<-done
	if len(batch) < 200 {
		t.Fatalf("%d batch grants, want a saturating batch", len(batch))
	}
	worst := 0
	for i, c := range calls {
		ahead := 0
		for _, g := range batch {
			if g.start.After(c.called) && g.start.Before(c.granted) {
				ahead++
			}
		}
		worst = max(worst, ahead)
		if ahead > 3 {
			t.Errorf("interactive call %d: %d batch grants between its Acquire and its grant (%v), want ≤ 3", i, ahead, c.granted.Sub(c.called))
		}
	}
	t.Logf("%d batch grants; at most %d passed an interactive caller", len(batch), worst)
}

// TestLanesBadInput: bad lanes are refused at New, or by the call, which
// then queues nothing.
func TestLanesBadInput(t *testing.T) {
	e := newEnv(t)
	long := strings.Repeat("x", 129)
	for _, c := range []struct {
		lanes []sluice.Lane
		want  string
	}{
		{[]sluice.Lane{{Name: ""}}, "lane name is empty"},
		{[]sluice.Lane{{Name: long}}, "more than 128"},
		{[]sluice.Lane{{Name: "a b"}}, "space"},
		{[]sluice.Lane{{Name: "a|b"}}, "'|'"},
		{[]sluice.Lane{{Name: "a", Weight: -1}}, "Weight -1"},
		{[]sluice.Lane{{Name: "a", Priority: -1}}, "Priority -1"},
		{[]sluice.Lane{{Name: "a", Priority: 1001}}, "Priority 1001"},
		{[]sluice.Lane{{Name: "a"}, {Name: "a", Weight: 2}}, "listed twice"},
	} {
		_, err := New(e.rdb, Config{Name: t.Name(), Capacity: 1, Lanes: c.lanes})
		if !errors.Is(err, sluice.ErrConfig) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Lanes %.40v: %v, want ErrConfig saying %q", c.lanes, err, c.want)
		}
	}
	s := e.sem(t, Config{Name: t.Name(), Capacity: 1})
	p := acquire(t, s, time.Second) // the permit: a good arrival would queue
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, name := range []string{"", long, "tab\there", "a|b"} {
		if _, err := s.Acquire(WithLane(ctx, name)); !errors.Is(err, sluice.ErrConfig) || !strings.Contains(err.Error(), "WithLane") {
			t.Errorf("Acquire, WithLane(%.10q): %v, want ErrConfig from WithLane", name, err)
		}
		err := s.Do(WithLane(ctx, name), func(context.Context) error { return errors.New("ran") })
		if !errors.Is(err, sluice.ErrConfig) {
			t.Errorf("Do, WithLane(%.10q): %v, want ErrConfig, fn not run", name, err)
		}
	}
	if keys, err := e.rdb.Keys(ctx, "sluice:{"+t.Name()+"}:lane*").Result(); err != nil || len(keys) > 0 {
		t.Errorf("lane keys %v (%v), want none: nothing queued", keys, err)
	}
	if n := queueLen(t, e.rdb, s); n != 0 {
		t.Errorf("%d waiters in Redis, want none", n)
	}
	if st := s.Stats(); st.Waiting != 0 {
		t.Errorf("Stats %+v, want nobody waiting", st)
	}
	releaseGone(t, e.rdb, p)
}

// TestLanesBucketContext: a ctx made by bucket.WithLane names the lane
// for the semaphore too (one ctx key for both).
func TestLanesBucketContext(t *testing.T) {
	e := newEnv(t)
	s := e.sem(t, Config{Name: t.Name(), Capacity: 1, Lanes: []sluice.Lane{{Name: "tenant-7", Weight: 3, Priority: 2}}})
	p := acquire(t, s, time.Second)
	ctx, cancel := context.WithCancel(bucket.WithLane(context.Background(), "tenant-7"))
	defer cancel()
	got := make(chan error, 1)
	go func() {
		q, err := s.Acquire(ctx)
		if err == nil {
			err = q.Release(context.Background())
		}
		got <- err
	}()
	var ids []string
	waitFor(t, 2*time.Second, "the waiter in lane tenant-7", func() bool {
		ids = e.rdb.ZRange(ctx, s.lanes+":tenant-7", 0, -1).Val()
		return len(ids) == 1
	})
	if !strings.HasSuffix(ids[0], "#3,2,tenant-7") {
		t.Errorf("waiter id %q, want the lane of weight 3 and priority 2", ids[0])
	}
	if n := queueLen(t, e.rdb, s); n != 0 {
		t.Errorf("%d waiters in the default lane, want none", n)
	}
	in, err := s.Inspect(context.Background())
	if err != nil || in.Queued != 1 || in.HeadWeight != 1 {
		t.Errorf("Inspect %+v (%v), want 1 queued, head weight 1", in, err)
	}
	releaseGone(t, e.rdb, p)
	if err := <-got; err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Second, "nothing but the config left", func() bool { return e.stateLeft(t) == 0 })
}

// TestLanesFIFO: within a lane waiters are served in their order of
// arrival, and two lanes of equal weight alternate (ties go by name).
func TestLanesFIFO(t *testing.T) {
	e := newEnv(t)
	s := e.sem(t, Config{Name: t.Name(), Capacity: 1})
	p := acquire(t, s, time.Second)
	var mu sync.Mutex
	var order []string
	var wg sync.WaitGroup
	for i, who := range []string{"y1", "y2", "y3", "x1", "x2", "x3"} {
		ctx := WithLane(context.Background(), who[:1])
		wg.Go(func() {
			q, err := s.Acquire(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			order = append(order, who)
			mu.Unlock()
			q.Release(ctx)
		})
		waitFor(t, time.Second, who+" queued", func() bool {
			in, err := s.Inspect(context.Background())
			return err == nil && in.Queued == i+1
		})
	}
	releaseGone(t, e.rdb, p)
	wg.Wait()
	if want := []string{"x1", "y1", "x2", "y2", "x3", "y3"}; !slices.Equal(order, want) {
		t.Errorf("served %v, want %v", order, want)
	}
}

// TestLanesAcrossProcesses: three processes, one lane each (c of weight
// 2), each with more waiters than permits, share the permits by weight
// within 5 % of each share; capacity is never exceeded.
func TestLanesAcrossProcesses(t *testing.T) {
	e := newEnv(t)
	e.srv.RequireReal(t)
	const capacity = 4
	lanes := []string{"a", "b", "c"}
	var workers []*worker
	for _, lane := range lanes {
		workers = append(workers, startWorker(t, "saturate", workerConfig{
			Addr: e.srv.Addr(), Name: t.Name(), Capacity: capacity, Goroutines: 8, Duration: 3 * time.Second,
			Lane: lane, Lanes: []sluice.Lane{{Name: "c", Weight: 2}},
		}))
	}
	var ivs []interval
	var gs []laneGrant
	var from, to time.Time // when all three ran
	for i, w := range workers {
		var first, last time.Time
		for _, ev := range w.all(t, 20*time.Second) {
			switch ev.Ev {
			case "interval":
				ivs = append(ivs, interval{ev.Start, ev.End})
				at := time.Unix(0, ev.Start)
				gs = append(gs, laneGrant{lane: lanes[i], weight: 1, start: at})
				if first.IsZero() || at.Before(first) {
					first = at
				}
				if at.After(last) {
					last = at
				}
			case "error":
				t.Errorf("worker %s: %s", lanes[i], ev.Err)
			}
		}
		if from.IsZero() || first.After(from) {
			from = first
		}
		if to.IsZero() || last.Before(to) {
			to = last
		}
	}
	if peak, violations := maxOverlap(ivs, capacity); violations > 0 {
		t.Fatalf("%d acquisitions above capacity %d (peak %d)", violations, capacity, peak)
	}
	from, to = from.Add(300*time.Millisecond), to.Add(-300*time.Millisecond)
	if to.Sub(from) < time.Second {
		t.Fatalf("the three processes ran together for %v, want ≥ 1 s more than the margins", to.Sub(from))
	}
	got, total := permitsBetween(gs, from, to)
	t.Logf("permits in the %v all three ran: %v (total %d)", to.Sub(from), got, total)
	checkShares(t, got, total, map[string]float64{"a": 0.25, "b": 0.25, "c": 0.5})
}
