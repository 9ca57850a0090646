package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// TestQuotaScenario runs a short quota run in two worker processes and
// checks the figures that must hold on any machine: grants of every
// policy's unit, none over any policy's allowance, none overtaken, the
// PU-per-minute policy binding, and a plot drawn.
func TestQuotaScenario(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	plot := filepath.Join(t.TempDir(), "quota.svg")
	var stdout, stderr bytes.Buffer
	args := []string{"--redis", srv.URL(), "--scenario", "quota", "--quota-duration", "1s",
		"--quota-callers", "40", "--quota-procs", "2", "--quota-plot", plot, "--json"}
	if err := run(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	var rep struct {
		Quota    *Quota    `json:"quota"`
		Saturate *Saturate `json:"saturate"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, stdout.String())
	}
	q := rep.Quota
	if q == nil || rep.Saturate != nil || len(q.Policies) != 3 {
		t.Fatalf("want only the quota scenario, with 3 policies: %s", stdout.String())
	}
	// 1,000 PU at once, then 16,667 PU/s for about a second: some 500
	// requests of 30.5 PU on average.
	if q.Grants < 100 || q.Errors != 0 {
		t.Errorf("%d grants, %d errors (%s); want > 100 and none", q.Grants, q.Errors, q.Err)
	}
	for _, p := range q.Policies {
		if p.Units < q.Grants || p.ExcessSlots > 0 {
			t.Errorf("%s: %d units granted (want ≥ %d grants), busiest window by slot %d over", p.Name, p.Units, q.Grants, p.ExcessSlots)
		}
	}
	if req, min, month := q.Policies[0], q.Policies[1], q.Policies[2]; req.Units != q.Grants || min.Units != month.Units || min.Units > 60*q.Grants {
		t.Errorf("units: %d requests, %d and %d PU, for %d grants of 1–60 PU", req.Units, min.Units, month.Units, q.Grants)
	}
	if q.Binding != 1 || q.OvertakenSlot != 0 {
		t.Errorf("binding policy %q, overtaken %d; want PU per minute and 0", q.Policies[q.Binding].Name, q.OvertakenSlot)
	}
	if fi, err := os.Stat(plot); err != nil || fi.Size() == 0 {
		t.Errorf("plot: %v", err)
	}
}

// TestQuotaFlags: the scenario's flags are checked before anything runs,
// and are refused when the scenario is left out.
func TestQuotaFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--scenario", "quota", "--quota-callers", "0"}, "--quota-callers 0"},
		{[]string{"--scenario", "quota", "--quota-procs", "5", "--quota-callers", "4"}, "--quota-procs 5"},
		{[]string{"--scenario", "quota", "--quota-duration", "0s"}, "--quota-duration 0s"},
		{[]string{"--scenario", "overhead", "--quota-plot", "x.svg"}, "--quota-plot is a flag of the quota scenario"},
	} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), tc.args, &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}

// TestJudgeQuota judges a handful of grants by hand: units per policy, a
// window over one policy's allowance and not the other's, an overtaken
// grant, polls, and which policy binds.
func TestJudgeQuota(t *testing.T) {
	base := time.Unix(1_700_000_000, 0)
	grant := func(ticket int64, ms float64, cost, polls int) loadgen.Grant {
		at := base.Add(time.Duration(ms * float64(time.Millisecond)))
		return loadgen.Grant{Ticket: ticket, Slot: at.UnixMicro(), Start: at.UnixNano() - 1e6, End: at.UnixNano(), Cost: cost, Polls: polls}
	}
	ps := []QuotaPolicy{
		{Name: "requests", Capacity: 10, RefillAmount: 1, RefillFrequency: 10 * time.Millisecond},
		{Name: "PU", Unit: "pu", Capacity: 50, RefillAmount: 10, RefillFrequency: 10 * time.Millisecond},
	}
	grants := []loadgen.Grant{
		grant(1, 0, 40, 0),
		grant(2, 0, 20, 1), // 60 PU at once: capacity and one refill
		grant(4, 10, 10, 1),
		grant(3, 15, 5, 2), // ticket 4's slot preceded this one: overtaken
		{Ticket: 5, Err: "deadline"},
	}
	q := judgeQuota(grants, ps, 25*time.Millisecond)
	if q.Grants != 4 || q.Errors != 1 || q.Err != "deadline" {
		t.Errorf("%d grants, %d errors (%q)", q.Grants, q.Errors, q.Err)
	}
	req, pu := q.Policies[0], q.Policies[1]
	if req.Units != 4 || pu.Units != 75 {
		t.Errorf("units %d requests, %d PU; want 4 and 75", req.Units, pu.Units)
	}
	// 0 to 15 ms: 75 PU where 50 + 10 × (1 + 1) = 70 are allowed.
	if pu.ExcessSlots != 5 || req.ExcessSlots > 0 {
		t.Errorf("excess by slot: requests %d, PU %d; want ≤ 0 and 5", req.ExcessSlots, pu.ExcessSlots)
	}
	if q.Binding != 1 || q.Span != 15*time.Millisecond {
		t.Errorf("binding %d over %v; want the PU policy over 15ms", q.Binding, q.Span)
	}
	// (75 − 50) PU at 1,000 PU/s need 25 ms, in 15 ms.
	if d := pu.Utilization - 25.0/15; d > 1e-9 || d < -1e-9 {
		t.Errorf("PU utilization %.4f, want %.4f", pu.Utilization, 25.0/15)
	}
	if q.OvertakenSlot != 1 || q.Queued != 3 || q.PollsPerQueued != 4.0/3 || q.MaxPolls != 2 {
		t.Errorf("overtaken %d, queued %d, polls per queued %.3f (max %d)", q.OvertakenSlot, q.Queued, q.PollsPerQueued, q.MaxPolls)
	}
}
