package guarantee

import (
	"math/rand/v2"
	"testing"
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
	l := Limit{Capacity: 2, Amount: 1, Every: 10 * time.Millisecond}
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
		l := Limit{Capacity: 1 + rng.IntN(5), Amount: 1 + rng.IntN(3), Every: time.Duration(1+rng.IntN(20)) * time.Millisecond}
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

func BenchmarkCheck(b *testing.B) {
	rng := rand.New(rand.NewPCG(3, 4))
	g := make([]time.Time, 100_000)
	base := time.Now()
	for i := range g {
		g[i] = base.Add(time.Duration(rng.IntN(200_000_000_000)))
	}
	l := Limit{Capacity: 50, Amount: 1, Every: 2 * time.Millisecond}
	b.ReportAllocs()
	for b.Loop() {
		Check(g, l)
	}
}
