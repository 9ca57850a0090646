package guarantee

import (
	"math/rand/v2"
	"testing"

	"github.com/sluicehq/sluice/internal/protocol"
	"time"
)

func at(ms ...float64) []time.Time {
	base := time.Unix(1_700_000_000, 0)
	out := make([]time.Time, len(ms))
	for i, m := range ms {
		out[i] = base.Add(time.Duration(m * float64(time.Millisecond)))
	}
	return out
}

func TestCheckTable(t *testing.T) {
	l := Limit{Capacity: 2, RefillAmount: 1, RefillFrequency: 10 * time.Millisecond}
	for _, tc := range []struct {
		name   string
		grants []time.Time
		excess int
	}{
		{"none", nil, 0},
		{"one", at(0), 1 - 3},
		{"burst of capacity plus one refill", at(0, 0, 0), 0},
		{"one too many at once", at(0, 0, 0, 0), 1},
		{"steady at the rate", at(0, 0, 0, 10, 20, 30, 40), 0},
		{"refill one µs early", at(0, 0, 0, 10, 19.999), 1},
		{"exactly one period later", at(0, 0, 0, 10, 20), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Check(tc.grants, l)
			if got.Excess != tc.excess {
				t.Errorf("Check: excess %d, want %d (%v)", got.Excess, tc.excess, got)
			}
			if b := Brute(tc.grants, l, 0); b.Excess != got.Excess {
				t.Errorf("Brute excess %d, Check %d", b.Excess, got.Excess)
			}
		})
	}
}

// TestCheckMatchesBrute compares the fast checker with the definition on
// random grant sets, dense enough that both holding and failing sets occur.
func TestCheckMatchesBrute(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	fails := 0
	for trial := 0; trial < 2000; trial++ {
		l := Limit{Capacity: 1 + rng.IntN(5), RefillAmount: 1 + rng.IntN(3), RefillFrequency: time.Duration(1+rng.IntN(20)) * time.Millisecond}
		n := rng.IntN(60)
		ms := make([]float64, n)
		for i := range ms {
			ms[i] = float64(rng.IntN(200_000)) / 1000
		}
		g := at(ms...)
		slack := time.Duration(rng.IntN(3)) * time.Duration(rng.IntN(30)) * time.Millisecond / 2
		fast, slow := CheckSlack(g, l, slack), Brute(g, l, slack)
		if fast.Excess != slow.Excess {
			t.Fatalf("trial %d %+v slack %v: Check %v, Brute %v", trial, l, slack, fast, slow)
		}
		if slow.Excess > 0 {
			fails++
		}
	}
	if fails == 0 || fails == 2000 {
		t.Fatalf("random sets were all one kind (%d failing): the comparison proves little", fails)
	}
}

// costs pairs at(ms...) with costs.
func costs(ms []float64, cs ...int) []Grant {
	ts := at(ms...)
	gs := make([]Grant, len(ts))
	for i := range ts {
		gs[i] = Grant{At: ts[i], Cost: cs[i]}
	}
	return gs
}

func TestCheckCostsTable(t *testing.T) {
	l := Limit{Capacity: 10, RefillAmount: 2, RefillFrequency: 10 * time.Millisecond}
	for _, tc := range []struct {
		name   string
		grants []Grant
		excess int
	}{
		{"none", nil, 0},
		{"only zero costs", costs([]float64{0, 0, 5}, 0, 0, 0), 0},
		{"one", costs([]float64{0}, 5), 5 - 12},
		{"capacity plus one refill at once", costs([]float64{0, 0}, 7, 5), 0},
		{"one unit too many at once", costs([]float64{0, 0}, 7, 6), 1},
		{"zero costs change nothing", costs([]float64{0, 0, 0, 3, 9.9}, 0, 7, 5, 0, 0), 0},
		{"a zero cost stretches no window", costs([]float64{-30, 0, 0}, 0, 7, 6), 1},
		{"steady at the rate", costs([]float64{0, 10, 20, 30}, 12, 2, 2, 2), 0},
		{"refill one µs early", costs([]float64{0, 9.999}, 12, 2), 2},
		{"a large cost after a period", costs([]float64{0, 10}, 11, 3), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := CheckCosts(tc.grants, l, 0)
			if got.Excess != tc.excess {
				t.Errorf("CheckCosts: excess %d, want %d (%v)", got.Excess, tc.excess, got)
			}
			if b := BruteCosts(tc.grants, l, 0); b.Excess != got.Excess {
				t.Errorf("BruteCosts excess %d, CheckCosts %d", b.Excess, got.Excess)
			}
		})
	}
}

// TestCheckCostsMatchesBrute compares the fast checker with the definition
// on random grants with costs, zero costs and grants at equal instants
// among them, dense enough that both holding and failing sets occur; and
// the unweighted checker with the weighted one at cost 1.
func TestCheckCostsMatchesBrute(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	fails := 0
	const trials = 3000
	for trial := 0; trial < trials; trial++ {
		l := Limit{Capacity: 1 + rng.IntN(40), RefillAmount: 1 + rng.IntN(10), RefillFrequency: time.Duration(1+rng.IntN(20)) * time.Millisecond}
		n := rng.IntN(60)
		gs := make([]Grant, n)
		for i := range gs {
			ms := float64(rng.IntN(200_000)) / 1000
			if i > 0 && rng.IntN(4) == 0 {
				ms = float64(gs[rng.IntN(i)].At.Sub(at(0)[0])) / float64(time.Millisecond) // an instant already granted at
			}
			c := 1 + rng.IntN(12)
			if rng.IntN(5) == 0 {
				c = 0
			}
			gs[i] = Grant{At: at(ms)[0], Cost: c}
		}
		slack := time.Duration(rng.IntN(3)) * time.Duration(rng.IntN(30)) * time.Millisecond / 2
		fast, slow := CheckCosts(gs, l, slack), BruteCosts(gs, l, slack)
		if fast.Excess != slow.Excess || fast.Units != slow.Units || fast.Grants != n {
			t.Fatalf("trial %d %+v slack %v: CheckCosts %v, BruteCosts %v", trial, l, slack, fast, slow)
		}
		if fast.Units > 0 && fast.InWindow-l.Allowed(fast.To.Sub(fast.From)+slack) != fast.Excess {
			t.Fatalf("trial %d: the window reported (%v) does not have the excess reported", trial, fast)
		}
		if slow.Excess > 0 {
			fails++
		}
		ts := make([]time.Time, n)
		for i, g := range gs {
			ts[i] = g.At
		}
		if one, w := CheckSlack(ts, l, slack), CheckCosts(ones(ts), l, slack); one.Excess != w.Excess {
			t.Fatalf("trial %d: CheckSlack %v, CheckCosts at cost 1 %v", trial, one, w)
		}
	}
	if fails < trials/10 || fails > trials*9/10 {
		t.Fatalf("%d of %d random sets failed: too one-sided for the comparison to prove much", fails, trials)
	}
}

// TestCheckCostsFails: a set that breaks the promise by one unit in one
// window far inside a long run is found, with its window.
func TestCheckCostsFails(t *testing.T) {
	l := Limit{Capacity: 100, RefillAmount: 1, RefillFrequency: time.Millisecond}
	var gs []Grant
	for k := range 5000 {
		gs = append(gs, Grant{At: at(float64(k))[0], Cost: 1})
	}
	gs[0].Cost = 101 // capacity and the first refill, then one a refill: exactly at the limit
	if r := CheckCosts(gs, l, 0); r.Excess != 0 {
		t.Fatalf("at the limit: %v, want excess 0", r)
	}
	gs[3000].Cost, gs[3001].Cost = 0, 2 // a unit granted a refill late: still within
	if r := CheckCosts(gs, l, 0); r.Excess != 0 {
		t.Fatalf("a unit granted late: %v, want excess 0", r)
	}
	gs[3000].Cost = 1 // one more unit than the refills paid for
	r := CheckCosts(gs, l, 0)
	if r.Excess != 1 || r.OK() || !r.To.Equal(gs[3001].At) {
		t.Fatalf("one unit over: %v, want excess 1 in a window ending at %v", r, gs[3001].At)
	}
	if b := BruteCosts(gs, l, 0); b.Excess != r.Excess {
		t.Fatalf("BruteCosts %v, CheckCosts %v", b, r)
	}
}

func TestNegativeCostPanics(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Error("CheckCosts took a negative cost")
		}
	}()
	CheckCosts(costs([]float64{0}, -1), Limit{Capacity: 1, RefillAmount: 1, RefillFrequency: time.Second}, 0)
}

func BenchmarkCheck(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	g := make([]time.Time, 100_000)
	base := time.Now()
	for i := range g {
		g[i] = base.Add(time.Duration(rng.IntN(200_000_000_000)))
	}
	l := Limit{Capacity: 50, RefillAmount: 1, RefillFrequency: 2 * time.Millisecond}
	b.ReportAllocs()
	for b.Loop() {
		Check(g, l)
	}
}

func BenchmarkCheckCosts(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	g := make([]Grant, 100_000)
	base := time.Now()
	for i := range g {
		g[i] = Grant{At: base.Add(time.Duration(rng.IntN(200_000_000_000))), Cost: rng.IntN(61)}
	}
	l := Limit{Capacity: 1000, RefillAmount: 1, RefillFrequency: 60 * time.Microsecond}
	b.ReportAllocs()
	for b.Loop() {
		CheckCosts(g, l, 0)
	}
}

// TestCheckChargesMatchesBrute: over charges with give-backs (negative)
// and debts, CheckCharges finds BruteCharges's worst window when no two
// charges share an instant, and never judges more leniently when some do.
func TestCheckChargesMatchesBrute(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	fails, stricter := 0, 0
	const trials = 3000
	for trial := 0; trial < trials; trial++ {
		l := Limit{Capacity: 1 + rng.IntN(40), RefillAmount: 1 + rng.IntN(10), RefillFrequency: time.Duration(1+rng.IntN(20)) * time.Millisecond}
		n := 1 + rng.IntN(60)
		shared := trial%2 == 1
		gs := make([]Grant, n)
		for i := range gs {
			us := rng.IntN(200_000_000)
			if shared && i > 0 && rng.IntN(3) == 0 {
				us = int(gs[rng.IntN(i)].At.Sub(at(0)[0]) / time.Microsecond)
			}
			c := 1 + rng.IntN(12)
			if rng.IntN(3) == 0 {
				c = -c
			}
			gs[i] = Grant{At: at(0)[0].Add(time.Duration(us) * time.Microsecond), Cost: c}
		}
		fast, slow := CheckCharges(gs, l, 0), BruteCharges(gs, l, 0)
		switch {
		case fast.Units != slow.Units:
			t.Fatalf("trial %d: units %d and %d", trial, fast.Units, slow.Units)
		case fast.Excess < slow.Excess:
			t.Fatalf("trial %d %+v: CheckCharges %v more lenient than BruteCharges %v", trial, l, fast, slow)
		case fast.Excess > slow.Excess && !shared:
			t.Fatalf("trial %d %+v: CheckCharges %v, BruteCharges %v, with no shared instant", trial, l, fast, slow)
		case fast.Excess > slow.Excess:
			stricter++
		}
		if slow.Excess > 0 {
			fails++
		}
	}
	if fails < trials/10 || fails > trials*9/10 {
		t.Fatalf("%d of %d random sets failed: too one-sided for the comparison to prove much", fails, trials)
	}
	t.Logf("%d of %d sets failed; %d judged more strictly for charges at a shared instant", fails, trials, stricter)
}

// TestCheckWindowsMatchBrute: the window checks find what trying every
// window finds: for a rolling window, every closed window of its length
// from a grant on; for a fixed one, each window of the grid.
func TestCheckWindowsMatchBrute(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	fails := [3]int{}
	const trials = 2000
	for trial := 0; trial < trials; trial++ {
		w := time.Duration(1+rng.IntN(50)) * time.Millisecond
		l := Limit{Capacity: 1 + rng.IntN(30), RefillFrequency: w, Kind: protocol.Rolling}
		l.RefillAmount = l.Capacity
		n := rng.IntN(60)
		gs := make([]Grant, n)
		for i := range gs {
			us := rng.IntN(200_000)
			if i > 0 && rng.IntN(4) == 0 {
				us = int(gs[rng.IntN(i)].At.Sub(at(0)[0]) / time.Microsecond)
			}
			gs[i] = Grant{At: at(0)[0].Add(time.Duration(us) * time.Microsecond), Cost: rng.IntN(6)}
		}
		// Rolling, by brute force.
		worst := 0
		if units := func() int {
			u := 0
			for _, g := range gs {
				u += g.Cost
			}
			return u
		}(); units > 0 {
			worst = -1 << 62
			for _, a := range gs {
				sum := 0
				for _, b := range gs {
					if d := b.At.Sub(a.At); d >= 0 && d <= w {
						sum += b.Cost
					}
				}
				worst = max(worst, sum-l.Capacity)
			}
		}
		if r := CheckCosts(gs, l, 0); r.Excess != worst && !(len(gs) == 0 && r.Excess == 0) {
			// With every cost 0 the fast check has nothing to judge.
			if worst != -1<<62 || r.Units != 0 {
				t.Fatalf("trial %d rolling %+v: CheckCosts %v, brute excess %d", trial, l, r, worst)
			}
		}
		if worst > 0 {
			fails[0]++
		}
		// Fixed, by brute force over the grid.
		l.Kind, l.Offset = protocol.Fixed, time.Duration(rng.IntN(int(w)))
		per := map[int64]int{}
		worst = -1 << 62
		for _, g := range gs {
			if g.Cost == 0 {
				continue
			}
			k := (g.At.UnixNano() - int64(l.Offset)) / int64(w)
			per[k] += g.Cost
		}
		for _, u := range per {
			worst = max(worst, u-l.Capacity)
		}
		r := CheckCosts(gs, l, 0)
		switch {
		case len(per) == 0:
		case worst > 0 && r.Excess != worst:
			t.Fatalf("trial %d fixed %+v: CheckCosts %v, brute excess %d", trial, l, r, worst)
		case worst <= 0 && !r.OK():
			t.Fatalf("trial %d fixed %+v: CheckCosts %v, brute excess %d", trial, l, r, worst)
		}
		if worst > 0 {
			fails[1]++
		}
	}
	if fails[0] < trials/10 || fails[0] > trials*9/10 || fails[1] < trials/10 || fails[1] > trials*9/10 {
		t.Fatalf("%v of %d random sets failed: too one-sided to prove much", fails, trials)
	}
}
