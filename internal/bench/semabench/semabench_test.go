package semabench_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/bench/semabench"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

func TestOverlap(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(0, int64(ms)*int64(time.Millisecond)) }
	iv := func(a, b int) [2]time.Time { return [2]time.Time{at(a), at(b)} }
	for _, tc := range []struct {
		ivs              [][2]time.Time
		capacity         int
		peak, violations int
	}{
		{nil, 1, 0, 0},
		{[][2]time.Time{iv(0, 10), iv(10, 20)}, 1, 1, 0}, // touching is not overlapping
		{[][2]time.Time{iv(0, 10), iv(9, 20)}, 1, 2, 1},
		{[][2]time.Time{iv(0, 10), iv(1, 9), iv(2, 8), iv(3, 4)}, 2, 4, 2},
	} {
		peak, v := semabench.Overlap(tc.ivs, tc.capacity)
		if peak != tc.peak || v != tc.violations {
			t.Errorf("%v cap %d: peak %d violations %d, want %d %d", tc.ivs, tc.capacity, peak, v, tc.peak, tc.violations)
		}
	}
}

// TestRun runs a short scenario and checks what must hold on any machine:
// no over-admission, no lost leases, no errors. Speed goals are reported,
// not asserted (see BenchmarkScenario and docs/semaphore.md).
func TestRun(t *testing.T) {
	srv := redistest.New(t)
	var clients []redis.UniversalClient
	for range 4 {
		c := srv.Client()
		defer c.Close()
		clients = append(clients, c)
	}
	r, err := semabench.Run(context.Background(), clients, semabench.Options{BurstRounds: 5, Duration: 800 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("\n%s", r)
	if r.Violations != 0 || r.Lost != 0 || r.Errors != 0 {
		t.Fatalf("violations %d, lost %d, errors %d", r.Violations, r.Lost, r.Errors)
	}
	// The peak and the speed figures depend on the machine (the race
	// detector alone can keep 10 permits from ever being busy at once), so
	// they are logged above, not asserted.
}

// BenchmarkScenario runs the full scenario once per iteration and reports
// its figures; compare runs with benchstat.
//
//	go test -run '^$' -bench Scenario -benchtime 1x ./internal/bench/semabench/
func BenchmarkScenario(b *testing.B) {
	srv := redistest.New(b)
	var clients []redis.UniversalClient
	for range 4 {
		c := srv.Client()
		defer c.Close()
		clients = append(clients, c)
	}
	for b.Loop() {
		r, err := semabench.Run(context.Background(), clients, semabench.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Logf("\n%s", r)
		b.ReportMetric(float64(r.BurstMedian)/float64(time.Millisecond), "burst-ms")
		b.ReportMetric(100*r.Utilization, "util-%")
		b.ReportMetric(float64(r.WaitP99-r.WaitIdeal)/float64(time.Millisecond), "p99-over-ideal-ms")
		b.ReportMetric(float64(r.Violations), "violations")
	}
}

func TestHandoffs(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(0, int64(ms)*int64(time.Millisecond)) }
	iv := func(a, b int) [2]time.Time { return [2]time.Time{at(a), at(b)} }
	// Two places: holds end at 10 and 12; the next start at 11 and 15
	// (gaps 1 and 3); the first two starts found free places.
	ivs := [][2]time.Time{iv(0, 10), iv(0, 12), iv(11, 20), iv(15, 30)}
	got := semabench.Handoffs(ivs, at(0), at(100))
	want := []time.Duration{time.Millisecond, 3 * time.Millisecond}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Fatalf("gaps %v, want %v", got, want)
	}
	// Starts outside the window are paired but not counted.
	if got := semabench.Handoffs(ivs, at(12), at(100)); len(got) != 1 || got[0] != 3*time.Millisecond {
		t.Fatalf("gaps from 12 ms: %v, want [3ms]", got)
	}
}
