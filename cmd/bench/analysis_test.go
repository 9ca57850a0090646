package main

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
)

var t0 = time.Unix(1_700_000_000, 0)

func at(ms float64) time.Time { return t0.Add(time.Duration(ms * float64(time.Millisecond))) }

func TestPercentile(t *testing.T) {
	ms := func(v ...int) []time.Duration {
		var ds []time.Duration
		for _, x := range v {
			ds = append(ds, time.Duration(x)*time.Millisecond)
		}
		return ds
	}
	hundred := make([]time.Duration, 100)
	for i := range hundred {
		hundred[i] = time.Duration(i+1) * time.Millisecond
	}
	for _, tc := range []struct {
		name   string
		sorted []time.Duration
		p      float64
		want   time.Duration
	}{
		{"empty", nil, 50, 0},
		{"one", ms(7), 50, 7 * time.Millisecond},
		{"one p99", ms(7), 99, 7 * time.Millisecond},
		{"two p50 is the lower", ms(1, 2), 50, time.Millisecond},
		{"four p50", ms(1, 2, 3, 4), 50, 2 * time.Millisecond},
		{"four p99", ms(1, 2, 3, 4), 99, 4 * time.Millisecond},
		{"hundred p50", hundred, 50, 50 * time.Millisecond},
		{"hundred p99", hundred, 99, 99 * time.Millisecond},
		{"hundred p100", hundred, 100, 100 * time.Millisecond},
		{"hundred p0 is the min", hundred, 0, time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := percentile(tc.sorted, tc.p); got != tc.want {
				t.Errorf("percentile(p%v) = %v, want %v", tc.p, got, tc.want)
			}
		})
	}
}

func TestDistOf(t *testing.T) {
	d := distOf([]time.Duration{5, 1, 4, 2, 3}) // unsorted on purpose
	if d != (Dist{N: 5, P50: 3, P99: 5, Max: 5}) {
		t.Errorf("distOf = %+v", d)
	}
	if d := distOf(nil); d != (Dist{}) {
		t.Errorf("distOf(nil) = %+v", d)
	}
}

func TestOvertaken(t *testing.T) {
	for _, tc := range []struct {
		name    string
		tickets []int64
		at      []float64 // ms
		tol     time.Duration
		want    int
	}{
		{"empty", nil, nil, 0, 0},
		{"in order", []int64{1, 2, 3}, []float64{0, 2, 4}, 0, 0},
		{"ties are not overtakes", []int64{1, 2, 3}, []float64{0, 0, 0}, 0, 0},
		{"one swap", []int64{1, 2, 3}, []float64{0, 4, 2}, 0, 1},
		{"counted once per overtaken grant", []int64{1, 2, 3}, []float64{9, 1, 2}, 0, 1},
		{"each overtaken grant counts", []int64{1, 2, 3}, []float64{9, 8, 1}, 0, 2},
		{"reversed", []int64{1, 2, 3, 4}, []float64{4, 3, 2, 1}, 0, 3},
		{"input order does not matter", []int64{3, 1, 2}, []float64{2, 0, 4}, 0, 1},
		{"within tolerance", []int64{1, 2}, []float64{1.5, 1}, time.Millisecond, 0},
		{"beyond tolerance", []int64{1, 2}, []float64{2.5, 1}, time.Millisecond, 1},
		{"equal tickets never overtake each other", []int64{1, 1, 2}, []float64{5, 1, 6}, 0, 0},
		{"a later ticket overtakes both of an equal pair", []int64{1, 1, 2}, []float64{5, 6, 1}, 0, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts := make([]time.Time, len(tc.at))
			for i, ms := range tc.at {
				ts[i] = at(ms)
			}
			if got := overtaken(tc.tickets, ts, tc.tol); got != tc.want {
				t.Errorf("overtaken = %d, want %d", got, tc.want)
			}
		})
	}
}

// TestOvertakenBrute compares overtaken with the definition on random data.
func TestOvertakenBrute(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for round := 0; round < 200; round++ {
		n := r.IntN(30)
		tickets := make([]int64, n)
		ts := make([]time.Time, n)
		for i := range n {
			tickets[i] = int64(r.IntN(20))
			ts[i] = at(float64(r.IntN(20)))
		}
		tol := time.Duration(r.IntN(3)) * time.Millisecond
		want := 0
		for i := range n {
			for j := range n {
				if tickets[j] > tickets[i] && ts[j].Before(ts[i].Add(-tol)) {
					want++
					break
				}
			}
		}
		if got := overtaken(tickets, ts, tol); got != want {
			t.Fatalf("round %d: overtaken = %d, brute force %d (tickets %v)", round, got, want, tickets)
		}
	}
}

func TestThroughput(t *testing.T) {
	l := guarantee.Limit{Capacity: 10, RefillAmount: 1, RefillFrequency: 2 * time.Millisecond} // 500/s
	paced := func(burst, n int, every float64) []time.Time {
		var ts []time.Time
		for range burst {
			ts = append(ts, at(0))
		}
		for i := 1; i <= n; i++ {
			ts = append(ts, at(float64(i)*every))
		}
		return ts
	}
	for _, tc := range []struct {
		name     string
		slots    []time.Time
		wantRate float64
		wantUtil float64
	}{
		{"none", nil, 0, 0},
		{"burst only", paced(10, 0, 2), 0, 0},
		{"full: burst then every refill", paced(10, 500, 2), 500, 1},
		{"half", paced(10, 250, 4), 250, 0.5},
		{"above the limit shows as more than 1", paced(10, 500, 1), 1000, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := throughput(tc.slots, l)
			if got.Limit != 500 {
				t.Errorf("Limit = %v, want 500", got.Limit)
			}
			if !near(got.Rate, tc.wantRate) || !near(got.Utilization, tc.wantUtil) {
				t.Errorf("rate %v utilization %v, want %v and %v", got.Rate, got.Utilization, tc.wantRate, tc.wantUtil)
			}
		})
	}
}

func near(a, b float64) bool { return a-b < 1e-6*max(1, b) && b-a < 1e-6*max(1, b) }

func TestWorstWithin(t *testing.T) {
	l := guarantee.Limit{Capacity: 2, RefillAmount: 1, RefillFrequency: 10 * time.Millisecond}
	ms := func(v ...float64) []time.Time {
		var ts []time.Time
		for _, x := range v {
			ts = append(ts, at(x))
		}
		return ts
	}
	for _, tc := range []struct {
		name  string
		ts    []time.Time
		w     time.Duration
		want  int
		count int
	}{
		{"one grant", ms(0), time.Second, 1 - 3, 1},
		{"burst of capacity+1 at once holds", ms(0, 0, 0), time.Second, 0, 3},
		{"one too many at once", ms(0, 0, 0, 0), time.Second, 1, 4},
		{"paced at the limit holds", ms(0, 0, 0, 10, 20, 30), time.Second, 0, 3},
		// Over a long window 6 grants in 10 ms are one too many (Allowed
		// 4), but no window of ≤ 5 ms sees more than the burst.
		{"short windows miss a slow excess", ms(0, 0, 0, 10, 10, 10), 5 * time.Millisecond, 0, 3},
		{"long windows see it", ms(0, 0, 0, 10, 10, 10), time.Second, 2, 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, ok := worstWithin(tc.ts, l, tc.w)
			if !ok || got.Excess != tc.want || got.Count != tc.count {
				t.Errorf("worstWithin = %+v, %v; want excess %d over %d grants", got, ok, tc.want, tc.count)
			}
		})
	}
}

// TestWorstWithinMatchesBrute: with a window longer than the run,
// worstWithin is guarantee.Brute.
func TestWorstWithinMatchesBrute(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	l := guarantee.Limit{Capacity: 3, RefillAmount: 2, RefillFrequency: 5 * time.Millisecond}
	for round := 0; round < 100; round++ {
		ts := make([]time.Time, 1+r.IntN(40))
		for i := range ts {
			ts[i] = at(float64(r.IntN(100)))
		}
		got, ok := worstWithin(ts, l, time.Second)
		want := guarantee.Brute(ts, l, 0)
		if !ok || got.Excess != want.Excess {
			t.Fatalf("round %d: worstWithin %d, Brute %d", round, got.Excess, want.Excess)
		}
	}
}

// synthetic builds the grants of an ideal saturated run: capacity granted
// at once, then one per period to callers that queued in ticket order,
// each waiting wait, returning lateMs after its slot.
func synthetic(capacity, n int, every, wait time.Duration, late time.Duration) []loadgen.Grant {
	var gs []loadgen.Grant
	for i := range n {
		slot := t0
		g := loadgen.Grant{Ticket: int64(i + 1), RoundTrips: 1}
		if i >= capacity {
			slot = t0.Add(time.Duration(i-capacity+1) * every)
			g.Position, g.Polls, g.RoundTrips = 5, 1, 2
		}
		end := slot.Add(late)
		g.Slot = slot.UnixMicro()
		g.End = end.UnixNano()
		g.Start = end.Add(-wait).UnixNano()
		if i < capacity {
			g.Start = end.UnixNano()
		}
		gs = append(gs, g)
	}
	return gs
}

func TestAnalyseIdeal(t *testing.T) {
	l := guarantee.Limit{Capacity: 10, RefillAmount: 1, RefillFrequency: 2 * time.Millisecond}
	gs := synthetic(10, 1010, 2*time.Millisecond, 100*time.Millisecond, 300*time.Microsecond)
	s := analyse(gs, l, 0, 25*time.Millisecond, 2020)
	checks := []struct {
		name      string
		got, want any
	}{
		{"grants", s.Grants, 1010},
		{"errors", s.Errors, 0},
		{"utilization", near(s.Throughput.Utilization, 1), true},
		// The first refill comes one period after the burst: a window
		// from the burst to a refill has one token to spare.
		{"excess slots", s.ExcessSlots.All, -1},
		{"excess starts", s.ExcessStarts.All, -1},
		{"excess starts with slack", s.ExcessStartsSlack, -1 - 13},
		{"excess slots ≤1s", *s.ExcessSlots.Sec, -1},
		{"excess slots ≤100ms", *s.ExcessSlots.Tenth, -1},
		{"queued", s.Queued, 1000},
		{"wait p50", s.Wait.P50, 100 * time.Millisecond},
		{"max/median", s.MaxOverMedian, 1.0},
		{"overtaken slot", s.OvertakenSlot, 0},
		{"overtaken start", s.OvertakenStart, 0},
		{"polls per queued", s.PollsPerQueued, 1.0},
		{"round trips per grant", s.RoundTripsPerGrant(), 2.0},
		{"caller round trips per grant", s.CallerRoundTripsPerGrant(), 2010.0 / 1010},
		{"late p50", s.Late.P50, 300 * time.Microsecond},
		{"early", s.Early, 0},
		{"tardy", s.Tardy, 0},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestAnalyseFaults(t *testing.T) {
	l := guarantee.Limit{Capacity: 10, RefillAmount: 1, RefillFrequency: 2 * time.Millisecond}
	gs := synthetic(10, 110, 2*time.Millisecond, 100*time.Millisecond, 0)
	// Swap the slots of two queued callers: one is overtaken.
	gs[50].Slot, gs[51].Slot = gs[51].Slot, gs[50].Slot
	gs[50].End, gs[51].End = gs[51].End, gs[50].End
	// Two extra grants on one slot (same ticket: they overtake nobody):
	// one over the limit, as the ideal run has one to spare.
	extra := gs[80]
	gs = append(gs, extra, extra)
	// One returned early, one far too late, one failed, one re-entered
	// twice and waited twice as long.
	gs[90].End = gs[90].SlotTime().Add(-time.Millisecond).UnixNano()
	gs[91].End = gs[91].SlotTime().Add(40 * time.Millisecond).UnixNano()
	gs[92].Err = "bucket: boom"
	gs[93].Reentries = 2
	gs[93].Start -= int64(100 * time.Millisecond)

	s := analyse(gs, l, 0, 25*time.Millisecond, 0)
	checks := []struct {
		name      string
		got, want any
	}{
		{"grants", s.Grants, 111},
		{"errors", s.Errors, 1},
		{"first error", s.Err, "bucket: boom"},
		{"excess slots", s.ExcessSlots.All, 1},
		{"overtaken slot", s.OvertakenSlot, 1},
		{"early", s.Early, 1},
		{"tardy", s.Tardy, 1},
		{"reentries", s.Reentries, 2},
		{"reentered calls", s.ReenteredCalls, 1},
		{"wait max", s.Wait.Max, 200 * time.Millisecond},
		{"max/median", s.MaxOverMedian, 2.0},
	}
	for _, c := range checks {
		if c.got != c.want {
			t.Errorf("%s = %v, want %v", c.name, c.got, c.want)
		}
	}
}

func TestFormat(t *testing.T) {
	for _, tc := range []struct{ got, want string }{
		{commas(0), "0"},
		{commas(999), "999"},
		{commas(1000), "1,000"},
		{commas(-1234567), "-1,234,567"},
		{dur(0), "0"},
		{dur(26 * time.Microsecond), "26 µs"},
		{dur(1500 * time.Microsecond), "1.5 ms"},
		{dur(-2 * time.Millisecond), "-2 ms"},
		{dur(1620 * time.Millisecond), "1.62 s"},
		{dur(999700 * time.Microsecond), "1 s"}, // not "1e+03 ms"
		{dur(999700 * time.Nanosecond), "1 ms"},
		{dur(500 * time.Nanosecond), "0.5 µs"},
		{num(499.8), "500"},
		{num(12.345), "12.35"},
	} {
		if tc.got != tc.want {
			t.Errorf("got %q, want %q", tc.got, tc.want)
		}
	}
}

// TestAnalyseLateAnswers: steady-state grants whose reply came at or after
// the slot (Margin ≤ 0) are counted apart, and the final wait's lateness
// is judged over the others only.
func TestAnalyseLateAnswers(t *testing.T) {
	l := guarantee.Limit{Capacity: 10, RefillAmount: 1, RefillFrequency: 2 * time.Millisecond}
	gs := synthetic(10, 110, 2*time.Millisecond, 100*time.Millisecond, 300*time.Microsecond)
	for i := range gs {
		gs[i].Margin = int64(5 * time.Millisecond)
	}
	// Ten answered late, and late by 9 ms.
	for i := 50; i < 60; i++ {
		gs[i].Margin = int64(-time.Millisecond)
		gs[i].End = gs[i].Slot*1000 + int64(9*time.Millisecond)
	}
	s := analyse(gs, l, 0, 25*time.Millisecond, 220)
	if s.LateAnswer != 10 {
		t.Errorf("late answers %d, want 10", s.LateAnswer)
	}
	if s.LateInTime.N != s.LateSteady.N-10 || s.LateInTime.Max != 300*time.Microsecond {
		t.Errorf("in time: %d grants, max %v; want %d, 300µs", s.LateInTime.N, s.LateInTime.Max, s.LateSteady.N-10)
	}
	if s.LateSteady.Max != 9*time.Millisecond {
		t.Errorf("steady max %v, want 9ms", s.LateSteady.Max)
	}
}
