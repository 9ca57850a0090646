package main

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// TestPolicyChangeScenario runs a short policy-change run in two worker
// processes and checks what must hold on any machine: no error, every
// phase within its policy by grant time and saturated at it, each change
// timed and seen by both processes within a phase, and a plot drawn.
func TestPolicyChangeScenario(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	plot := filepath.Join(t.TempDir(), "policy-change.svg")
	var stdout, stderr bytes.Buffer
	const phase = 800 * time.Millisecond
	// 200/s → 100/s → 400/s: down to a burst of 5, which holds the 4 slots
	// 200/s hands out within the 20 ms lookahead before a change. Down to
	// 50/s (burst 2, the default), those 4 slots, which keep their times,
	// are 1 more than the new policy allows in their 15 ms (docs/limits.md,
	// "Changing the limit on purpose").
	args := []string{"--redis", srv.URL(), "--scenario", "policy-change", "--change-phase", phase.String(), "--change-rates", "200,100,400",
		"--change-callers", "40", "--change-procs", "2", "--change-plot", plot, "--json"}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a bound on a hang, not a speed goal
	defer cancel()
	if err := run(ctx, args, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	var rep struct {
		PolicyChange *PolicyChange `json:"policy_change"`
		Saturate     *Saturate     `json:"saturate"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, stdout.String())
	}
	l := rep.PolicyChange
	if l == nil || rep.Saturate != nil || len(l.Phases) != 3 {
		t.Fatalf("want only the policy-change scenario, with 3 phases: %s", stdout.String())
	}
	// 200/s, 100/s then 400/s for 0.8 s each: some 560 grants.
	if l.Grants < 300 || l.Errors != 0 {
		t.Errorf("%d grants, %d errors (%s); want > 300 and none", l.Grants, l.Errors, l.Err)
	}
	for i, p := range l.Phases {
		if p.ExcessSlots > 0 || p.Judged == 0 {
			t.Errorf("phase %d (%.0f/s): %d slots judged, busiest window %d over; want some and ≤ 0", i+1, p.perSecond(), p.Judged, p.ExcessSlots)
		}
		// As bucket.TestSetPoliciesUnderLoad: saturated at the policy in
		// force, with room for a slow machine.
		if p.Utilization < 0.8 {
			t.Errorf("phase %d (%.0f/s): %.0f grants/s in the middle half, want about the policy's rate", i+1, p.perSecond(), p.Rate)
		}
		if i == 0 {
			if p.Change != 0 || p.Reach != nil {
				t.Errorf("phase 1: change %v, reach %v; want none (the bucket's first policy)", p.Change, p.Reach)
			}
			continue
		}
		if p.Change <= 0 || len(p.Reach) != 2 || p.ReachMax < p.Change || p.ReachMax > phase {
			t.Errorf("phase %d: SetPolicies took %v, reached the processes after %v (max %v); want > 0, both within the phase", i+1, p.Change, p.Reach, p.ReachMax)
		}
	}
	if fi, err := os.Stat(plot); err != nil || fi.Size() == 0 {
		t.Errorf("plot: %v", err)
	}
}

// TestPolicyChangeFlags: the scenario's flags are checked before anything runs,
// and are refused when the scenario is left out.
func TestPolicyChangeFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--scenario", "policy-change", "--change-callers", "0"}, "--change-callers 0"},
		{[]string{"--scenario", "policy-change", "--change-procs", "5", "--change-callers", "4"}, "--change-procs 5"},
		{[]string{"--scenario", "policy-change", "--change-phase", "0s"}, "--change-phase 0s"},
		{[]string{"--scenario", "policy-change", "--change-rates", "200"}, "at least two"},
		{[]string{"--scenario", "policy-change", "--change-rates", "200,0"}, `--change-rates "200,0"`},
		{[]string{"--scenario", "policy-change", "--change-rates", "200,fast"}, `--change-rates "200,fast"`},
		{[]string{"--scenario", "policy-change", "--change-carry", "all"}, `--change-carry "all"`},
		{[]string{"--scenario", "policy-change", "--change-carry", "proportionally"}, "want proportional, as-is or fill"},
		{[]string{"--scenario", "overhead", "--change-plot", "x.svg"}, "--change-plot is a flag of the policy-change scenario"},
	} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), tc.args, &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}

// TestJudgePolicyChange judges a handful of grants by hand: two phases, a
// slot inside the change judged against both policies, an excess against
// the new policy only, the rate of each phase's middle half, and how long
// the change took to reach each process.
func TestJudgePolicyChange(t *testing.T) {
	base := time.Unix(1_700_000_000, 0)
	at := func(ms float64) time.Time { return base.Add(time.Duration(ms * float64(time.Millisecond))) }
	grant := func(proc int, slotMs, endMs float64) loadgen.Grant {
		return loadgen.Grant{Proc: proc, Slot: at(slotMs).UnixMicro(), Start: at(slotMs).UnixNano() - 1e6, End: at(endMs).UnixNano()}
	}
	fast := bucket.Policy{Capacity: 2, RefillAmount: 1, RefillFrequency: 10 * time.Millisecond} // 100/s
	slow := bucket.Policy{Capacity: 1, RefillAmount: 1, RefillFrequency: 50 * time.Millisecond} // 20/s
	const phase = 400 * time.Millisecond
	// Phase 1: a slot every 10 ms from 0 to 390 ms, all within 100/s.
	var grants []loadgen.Grant
	for k := range 40 {
		grants = append(grants, grant(k%2, float64(10*k), float64(10*k)))
	}
	change := changeCall{from: at(400), to: at(402)}
	// Phase 2: a slot inside the change (judged under both policies), then
	// one within the lookahead after it (handed out before the change,
	// for all we know), then one every 50 ms from 450 to 750 ms: process
	// 1's first certainly after the change returns at 450 ms, process 0's
	// at 500 ms.
	grants = append(grants, grant(0, 401, 401), grant(0, 410, 410))
	for k := range 7 {
		grants = append(grants, grant(1-k%2, float64(450+50*k), float64(450+50*k)))
	}
	// Two more slots at 780 ms: 3 in 30 ms where 20/s allows 1 + 1.
	grants = append(grants, grant(0, 780, 781), grant(1, 780, 781), loadgen.Grant{Err: "deadline"})
	lf := judgePolicyChange(grants, []bucket.Policy{fast, slow}, []changeCall{change}, phase, 2, 20*time.Millisecond, 25*time.Millisecond)
	if lf.Grants != 51 || lf.Errors != 1 || lf.Err != "deadline" || len(lf.Phases) != 2 {
		t.Fatalf("%d grants, %d errors (%q), %d phases", lf.Grants, lf.Errors, lf.Err, len(lf.Phases))
	}
	p1, p2 := lf.Phases[0], lf.Phases[1]
	// Phase 1 judges its 40 slots and the one at 401 ms, the end of the
	// change: 41 in 401 ms where 100/s allows 2 + 41.
	if p1.Judged != 41 || p1.ExcessSlots > 0 || p1.Change != 0 || p1.Reach != nil {
		t.Errorf("phase 1: %d judged, excess %d, change %v, reach %v; want 41, ≤ 0, none", p1.Judged, p1.ExcessSlots, p1.Change, p1.Reach)
	}
	// Its middle half, 100 to 300 ms: 20 slots in 0.2 s.
	if p1.Steady != 20 || math.Abs(p1.Rate-100) > 1e-9 || math.Abs(p1.Utilization-1) > 1e-9 {
		t.Errorf("phase 1: %d steady slots, %.1f/s (%.2f); want 20, 100/s, 1", p1.Steady, p1.Rate, p1.Utilization)
	}
	// Phase 2 judges the slots at 401 and 410 ms, 7 more and the 2 at
	// 780 ms: 11 in 379 ms where 20/s allows 1 + 8.
	if p2.Judged != 11 || p2.ExcessSlots != 2 {
		t.Errorf("phase 2: %d judged, excess %d; want 11 and 2", p2.Judged, p2.ExcessSlots)
	}
	if p2.Change != 2*time.Millisecond || len(p2.Reach) != 2 || p2.Reach[0] != 100*time.Millisecond || p2.Reach[1] != 50*time.Millisecond || p2.ReachMax != 100*time.Millisecond {
		t.Errorf("phase 2: change %v, reach %v (max %v); want 2ms, [100ms 50ms], 100ms", p2.Change, p2.Reach, p2.ReachMax)
	}
	// Its middle half, 502 to 702 ms: the slots at 550, 600, 650, 700.
	if p2.Steady != 4 || math.Abs(p2.Rate-20) > 1e-9 {
		t.Errorf("phase 2: %d steady slots, %.1f/s; want 4, 20/s", p2.Steady, p2.Rate)
	}
	// A process with no grant assigned after the change has no reach.
	lf = judgePolicyChange(grants[:42], []bucket.Policy{fast, slow}, []changeCall{change}, phase, 2, 20*time.Millisecond, 25*time.Millisecond)
	if r := lf.Phases[1]; len(r.Reach) != 2 || r.Reach[0] != -1 || r.Reach[1] != -1 || r.ReachMax != -1 {
		t.Errorf("no grant after the change: reach %v (max %v), want -1 for both", r.Reach, r.ReachMax)
	}
}
