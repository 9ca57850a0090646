package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// TestLanesScenario runs the lanes scenario, shortened, in 2 worker
// processes and checks what must hold on any machine: every case ran,
// no Enter failed, every grant kept the limit, every interactive call
// was granted, each lane was served, the cost case measured steps and
// grants (on redis-server; on miniredis it says why it cannot), and the
// table has every row with its goal. The goals themselves are the
// bench's to judge, not this test's.
func TestLanesScenario(t *testing.T) {
	srv := redistest.New(t)
	var stdout, stderr bytes.Buffer
	args := []string{"--redis", srv.URL(), "--scenario", "lanes", "--lanes-procs", "2", "--lanes-duration", "600ms",
		"--lanes-tenants", "200", "--json"}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // a bound on a hang, not a speed goal
	defer cancel()
	if err := run(ctx, args, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	var rep struct {
		Lanes *Lanes `json:"lanes"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil || rep.Lanes == nil {
		t.Fatalf("no lanes figures (%v): %s", err, stdout.String())
	}
	ln := rep.Lanes
	checkLanes(t, ln, srv.Fake())

	var table bytes.Buffer
	tw := newTable(&table, "lanes")
	ln.table(tw, Limit{})
	tw.Flush()
	want := []string{"LANES", "fair share", "lane A", "lane B", "lane C", "C stopped: A and B take its share after", "priority",
		"interactive wait p50 / p99", "scheduler's cost", "excess over the limit",
		"goal within ±5 %", "goal ≥ 99 %", "goal ≤ 100 ms", "goal p99 ≤ 2 refill periods + a round trip", "goal 0"}
	if !srv.Fake() {
		want = append(want, "200 lanes: the step alone", "one lane: live", "no lanes (the default lane): the step alone", "goal ≤ 1.5×")
	}
	for _, w := range want {
		if !strings.Contains(table.String(), w) {
			t.Errorf("table lacks %q:\n%s", w, table.String())
		}
	}
}

// checkLanes checks the figures of a lanes run that must hold on any
// machine (fake: on miniredis).
func checkLanes(t *testing.T, ln *Lanes, fake bool) {
	t.Helper()
	if ln.Fair == nil || ln.Priority == nil || ln.Cost == nil {
		t.Fatalf("a case is missing: %+v", ln)
	}
	runs := map[string]lanesRun{"fair": ln.Fair.lanesRun, "priority": ln.Priority.lanesRun}
	if len(ln.Fair.Lanes) != 3 {
		t.Errorf("fair: %d lanes, want A, B and C", len(ln.Fair.Lanes))
	}
	for _, l := range ln.Fair.Lanes {
		if l.Rate <= 0 || l.Due <= 0 {
			t.Errorf("fair: lane %s served %.1f/s, due %.1f/s; want both > 0", l.Lane, l.Rate, l.Due)
		}
	}
	if p := ln.Priority; p.Calls != 3 || p.Wait.N != p.Calls || p.RTT <= 0 || p.Batch <= 0 {
		t.Errorf("priority: %d of %d interactive calls granted (want 3 of 3), round trip %v, batch %.1f/s", p.Wait.N, p.Calls, p.RTT, p.Batch)
	}
	switch c := ln.Cost; {
	case fake && (c.Skipped == "" || len(c.Rows) > 0):
		t.Errorf("cost on miniredis: skipped %q, %d rows; want it skipped, saying why", c.Skipped, len(c.Rows))
	case !fake && len(c.Rows) != 3:
		t.Errorf("cost: %d rows, want a lane each, one lane, no lanes: %+v", len(c.Rows), c)
	}
	for _, r := range ln.Cost.Rows {
		if r.Steps <= 0 || r.StepGrants <= 0 || r.StepUsec <= 0 || (r.Lanes > 0 && (r.LiveGrants <= 0 || r.LiveUsec <= 0)) {
			t.Errorf("cost, %d lanes: figures missing: %+v", r.Lanes, r)
		}
		if r.StepExcess > 0 {
			t.Errorf("cost, %d lanes: the step's slots went %d over the limit", r.Lanes, r.StepExcess)
		}
		runs[fmt.Sprintf("cost, %d lanes", r.Lanes)] = r.lanesRun
	}
	for name, r := range runs {
		if r.Errors != 0 || r.Excess > 0 {
			t.Errorf("%s: %d errors (%s), excess %d; want none and ≤ 0", name, r.Errors, r.Err, r.Excess)
		}
	}
}

// TestTakeover on made-up grant times: the next refill taken at once is
// one refill period; a gap is counted; a rate that never comes back is
// none (-1).
func TestTakeover(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms ...int) []time.Time {
		var ts []time.Time
		for _, m := range ms {
			ts = append(ts, t0.Add(time.Duration(m)*time.Millisecond))
		}
		return ts
	}
	every := func(from, to, step int) []int {
		var ms []int
		for m := from; m < to; m += step {
			ms = append(ms, m)
		}
		return ms
	}
	for _, tc := range []struct {
		name string
		ts   []time.Time
		want time.Duration
	}{
		{"every refill from the next", at(every(5, 500, 5)...), 5 * time.Millisecond},
		{"a gap of 100 ms first", at(every(105, 500, 5)...), 105 * time.Millisecond},
		{"half the rate only", at(every(10, 500, 10)...), -1},
		{"grants before the last one do not count", at(append(every(-200, 0, 5), every(60, 500, 5)...)...), 60 * time.Millisecond},
	} {
		end := t0.Add(500 * time.Millisecond)
		// 50 ms windows, 95 % of 200/s: 9.5 grants.
		if got := takeover(tc.ts, t0, end, 50*time.Millisecond, 9.5); got != tc.want {
			t.Errorf("%s: takeover %v, want %v", tc.name, got, tc.want)
		}
	}
}

// TestLanesRefusesBadFlags: the lanes flags are checked before anything
// runs.
func TestLanesRefusesBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--scenario", "lanes", "--lanes-cases", "fair,nope"}, `no case "nope"`},
		{[]string{"--scenario", "lanes", "--lanes-procs", "0"}, "--lanes-procs 0"},
		{[]string{"--scenario", "lanes", "--lanes-procs", "6"}, "--lanes-procs 6"},
		{[]string{"--scenario", "lanes", "--lanes-duration", "100ms"}, "--lanes-duration 100ms"},
		{[]string{"--scenario", "lanes", "--lanes-tenants", "1"}, "--lanes-tenants 1"},
		{[]string{"--scenario", "saturate", "--lanes-tenants", "10"}, "--lanes-tenants is a flag of the lanes scenario"},
	} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), tc.args, &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}
