package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/rediscall"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// TestOutageScenario runs the outage scenario shortened (9 s a run, Redis
// killed 2 s in and back 3 s later) and checks what must hold even on a
// loaded machine, with margins for it: without a fallback, next to
// nothing is granted while Redis is away and every call returns within
// its deadline and a margin; with the local share, the fleet keeps
// granting at least half the limit while Redis is away, no window holds
// more than the promise plus one Capacity, and the rate after recovery
// is close to the limit.
func TestOutageScenario(t *testing.T) {
	srv := redistest.New(t) // for the report's header: the scenario starts servers of its own
	srv.RequireReal(t)
	const deadline = 2 * time.Second
	var stdout, stderr bytes.Buffer
	args := []string{"--redis", srv.URL(), "--scenario", "outage", "--outage-duration", "9s", "--outage-at", "2s", "--outage-for", "3s",
		"--outage-deadline", deadline.String(), "--json"}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a bound on a hang, not a speed goal
	defer cancel()
	if err := run(ctx, args, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	var rep struct {
		Outage *Outage `json:"outage"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil || rep.Outage == nil {
		t.Fatalf("no outage figures (%v): %s", err, stdout.String())
	}
	o := rep.Outage
	var table bytes.Buffer
	tw := newTable(&table, "outage")
	o.table(tw, Limit{})
	tw.Flush()
	t.Logf("\n%s", table.String())
	if len(o.Rows) != 2 || o.Rows[0].Fallback != outageLocal || o.Rows[1].Fallback != outageNone {
		t.Fatalf("rows %+v, want the local share's run then the contrast's", o.Rows)
	}
	// A call may return late by a scheduling delay of this loaded host,
	// under the race detector: the goal is 100 ms, the test allows more.
	const late = 500 * time.Millisecond
	for _, r := range o.Rows {
		if r.Back-r.Down < 3*time.Second || r.Down < 2*time.Second {
			t.Errorf("%s: Redis away from %v to %v, want from 2 s for 3 s", r.Fallback, r.Down, r.Back)
		}
		if r.Grants < 200 || r.Calls < r.Grants {
			t.Errorf("%s: %d grants of %d calls, want hundreds", r.Fallback, r.Grants, r.Calls)
		}
		// A restarted empty Redis starts a full bucket without a fallback,
		// and from what the fleet granted with one: either way within the
		// promise plus one Capacity.
		for _, w := range []OutageWindow{r.Sec, r.Tenth} {
			if w.Most > w.Bound {
				t.Errorf("%s: %d grants in %v at %v, over the bound %d", r.Fallback, w.Most, w.Window, w.At, w.Bound)
			}
		}
		if r.Excess > 0 {
			t.Errorf("%s: a window %d over the promise plus one capacity", r.Fallback, r.Excess)
		}
		if r.Longest > deadline+late {
			t.Errorf("%s: a call took %v (%s), want ≤ its deadline %v + %v", r.Fallback, r.Longest, r.LongestErr, deadline, late)
		}
		if n := r.Failed["other"]; n > 0 {
			t.Errorf("%s: %d calls failed for an unexpected reason: %s", r.Fallback, n, r.Example["other"])
		}
	}

	local, none := o.Rows[0], o.Rows[1]
	// Without a fallback only slots handed out before the kill are
	// granted after it; they are counted when the callers return, and
	// 200 callers under -race on 2 CPUs return up to ~150 ms after their
	// slots (30 such grants, run alone, in a CI run). Next to nothing:
	// at most a tenth of what the limit allows over the outage.
	if float64(none.During) > 0.1*none.Allowed || none.Local != 0 {
		t.Errorf("without a fallback: %d grants while Redis was away (%d local), want next to nothing: the slots handed out before the kill (≤ %.0f, a tenth of the limit's %.0f)",
			none.During, none.Local, 0.1*none.Allowed, none.Allowed)
	}
	if none.FailedCalls() == 0 {
		t.Errorf("without a fallback: no call failed while Redis was away: %+v", none.Failed)
	}

	if float64(local.During) < 0.5*local.Allowed || local.Local == 0 {
		t.Errorf("with the local share: %d grants while Redis was away (%d local), want ≥ half the limit's %.0f", local.During, local.Local, local.Allowed)
	}
	if local.Recovery < 0.7 || local.Recovery > 1.1 {
		t.Errorf("with the local share: the rate after recovery is %.3f of the limit (%d grants in %v), want 0.7–1.1",
			local.Recovery, local.RecoveryGrants, local.RecoverySpan)
	}

	for _, w := range []string{"OUTAGE", "Fallback: LocalShare", "no fallback (the contrast)", "grants while Redis was away", "goal ≥ 0.6 of the limit",
		"no goal: for contrast", "busiest 1 s window", "busiest 100 ms window", "longest call", "goal ≤ the deadline + 100 ms",
		"rate after recovery", "goal 0.8–1.05", "admitted by the local share", "failed: "} {
		if !strings.Contains(table.String(), w) {
			t.Errorf("table lacks %q", w)
		}
	}
}

// TestOutageJudge judges made-up grants: 200/s steadily from the start,
// none while Redis is away but for a burst of 30 as it comes back.
func TestOutageJudge(t *testing.T) {
	begin := time.Unix(1_000_000, 0)
	down, back, until := begin.Add(4*time.Second), begin.Add(9*time.Second), begin.Add(12*time.Second)
	var grants []int64
	for at := begin; at.Before(until); at = at.Add(outageRefill) {
		if at.Before(down) || !at.Before(back) {
			grants = append(grants, at.UnixNano())
		}
	}
	for range 30 {
		grants = append(grants, back.UnixNano())
	}
	half := len(grants) / 2
	results := []outageResult{
		{Grants: grants[:half], Calls: half + 3, Longest: 2 * time.Second, LongestErr: "deadline passed",
			Failed: map[string]int{"connection refused": 3}, Example: map[string]string{"connection refused": "refused"}},
		{Grants: grants[half:], Calls: len(grants) - half, Longest: time.Second},
	}
	r := judgeRedisOutage(outageNone, results, begin, down, back, until, 2*time.Second)
	if r.Grants != len(grants) || r.Calls != len(grants)+3 || r.FailedCalls() != 3 || r.Failed["connection refused"] != 3 {
		t.Errorf("grants %d, calls %d, failed %v: want %d, %d, 3 refused", r.Grants, r.Calls, r.Failed, len(grants), len(grants)+3)
	}
	if r.During != 0 || r.Allowed != 1000 {
		t.Errorf("while away: %d grants of %v allowed, want 0 of 1000", r.During, r.Allowed)
	}
	if r.Longest != 2*time.Second || r.LongestErr != "deadline passed" {
		t.Errorf("longest call %v (%q), want the first worker's", r.Longest, r.LongestErr)
	}
	if r.Gap != 5*time.Second+outageRefill || r.GapAt != 4*time.Second-outageRefill {
		t.Errorf("longest gap %v from %v, want from the last grant before the kill to the restart", r.Gap, r.GapAt)
	}
	// From back + 1 s to the end: 2 s at 200/s.
	if r.RecoveryGrants != 400 || r.RecoverySpan != 2*time.Second || math.Abs(r.Recovery-1) > 1e-9 || !r.RecoveryMet() {
		t.Errorf("recovery: %d grants in %v, %.3f of the limit, want 400 in 2 s, 1", r.RecoveryGrants, r.RecoverySpan, r.Recovery)
	}
	// The burst at back and the steady grants after it: 30 + 201 in the
	// second from back, against 20 + 206 + 20.
	if r.Sec.Most != 231 || r.Sec.At != 9*time.Second || r.Sec.Bound != 246 {
		t.Errorf("busiest 1 s: %+v, want 231 at 9 s against 246", r.Sec)
	}
	if r.Tenth.Most != 51 || r.Tenth.Bound != 66 {
		t.Errorf("busiest 100 ms: %+v, want 51 against 66", r.Tenth)
	}
	if r.Excess > 0 {
		t.Errorf("excess %d over the promise plus one capacity, want ≤ 0", r.Excess)
	}
	if r.DuringMet() {
		t.Error("no grant while away meets the goal")
	}

	// A burst of 55 on top of the steady rate breaks the bound.
	for range 25 {
		grants = append(grants, back.UnixNano())
	}
	r = judgeRedisOutage(outageNone, []outageResult{{Grants: grants}}, begin, down, back, until, 2*time.Second)
	if r.Tenth.Most <= r.Tenth.Bound || r.Excess <= 0 {
		t.Errorf("a burst of 55: busiest 100 ms %+v, excess %d: want both over", r.Tenth, r.Excess)
	}
}

// TestOutageErrKind names the failures a user meets while Redis is away.
func TestOutageErrKind(t *testing.T) {
	refused := &rediscall.CallError{Prefix: "bucket", Err: syscall.ECONNREFUSED}
	for _, c := range []struct {
		err  error
		want string
	}{
		{refused, "connection refused"},
		{&rediscall.CallError{Prefix: "bucket", Ctx: context.DeadlineExceeded, Err: syscall.ECONNREFUSED}, "deadline passed, connection refused"},
		{&rediscall.CallError{Prefix: "bucket", Err: io.EOF}, "connection cut"},
		{&rediscall.CallError{Prefix: "bucket", Within: time.Second, Err: rediscall.ErrNoAnswer}, "no answer from Redis"},
		{fmt.Errorf("bucket: %w", context.DeadlineExceeded), "deadline passed"},
		{errors.New("something else"), "other"},
	} {
		if got := outageErrKind(c.err); got != c.want {
			t.Errorf("%v: %q, want %q", c.err, got, c.want)
		}
	}
}
