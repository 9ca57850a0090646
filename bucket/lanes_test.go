package bucket_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
	"github.com/sluicehq/sluice/internal/testing/redistest"
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
// returns the grants' slots (Redis clock) and costs per lane.
func runLanes(t *testing.T, b *bucket.Bucket, d time.Duration, loads ...laneLoad) map[string][]guarantee.Grant {
	t.Helper()
	// Cancelled, not a deadline: a deadline would refuse the callers whose
	// turn comes after it (sluice.ErrWaitTooLong).
	ctx, cancel := context.WithCancel(context.Background())
	defer time.AfterFunc(d, cancel).Stop()
	var mu sync.Mutex
	out := map[string][]guarantee.Grant{}
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
				mu.Unlock()
			})
		})
	}
	wg.Wait()
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
// each get their weight's share of the grants (±5 %), and together the
// whole rate.
func TestLanesFairShare(t *testing.T) {
	srv := redistest.New(t)
	cfg := bucket.Config{Capacity: 20, RefillAmount: 1, RefillFrequency: 5 * time.Millisecond,
		Lanes: []bucket.Lane{{Name: "c", Weight: 2}}}
	b := newBucket(t, srv.Client(), cfg)
	gs := runLanes(t, b, 4*time.Second, laneLoad{Lane: "a", Callers: 100}, laneLoad{Lane: "b", Callers: 20}, laneLoad{Lane: "c", Callers: 50})
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
	t.Logf("grants in 2 s: %v (total %d)", got, total)
	if want := 400; total < want*99/100 {
		t.Errorf("%d grants in 2 s, want ≥ 99 %% of %d", total, want)
	}
	for lane, w := range map[string]float64{"a": 0.25, "b": 0.25, "c": 0.5} {
		if share := float64(got[lane]) / float64(total); share < w-0.05 || share > w+0.05 {
			t.Errorf("lane %s: share %.3f, want %.2f ± 0.05", lane, share, w)
		}
	}
}
