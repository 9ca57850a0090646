package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testing/guarantee"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// TestImpatientScenario runs a short impatient run, sluice and
// redis_rate side by side in two worker processes, on a limit their
// callers overrun (20 callers of each at 20/s with a 300 ms deadline: a
// FIFO queue would make the last wait a second), and checks what must
// hold on any machine: both limiters were called, granted and refused,
// sluice held the limit by grant time and by start time, no call failed
// but for lack of time, and the table has its rows and goals.
// Utilization and how fast a call fails are the bench's to judge, not
// this test's.
func TestImpatientScenario(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	var stdout, stderr bytes.Buffer
	args := []string{"--redis", srv.URL(), "--scenario", "impatient", "--json",
		"--impatient-duration", "1s", "--impatient-callers", "20", "--impatient-procs", "2",
		"--impatient-rate", "20", "--impatient-burst", "2", "--impatient-deadline", "300ms"}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // a bound on a hang, not a speed goal
	defer cancel()
	if err := run(ctx, args, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	var rep struct {
		Impatient *Impatient `json:"impatient"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil || rep.Impatient == nil {
		t.Fatalf("no impatient figures (%v): %s", err, stdout.String())
	}
	im := rep.Impatient
	if len(im.Results) != 2 || im.Results[0].Name != limSluice || im.Results[1].Name != limRedisRate {
		t.Fatalf("want sluice's results, then redis_rate's: %+v", im.Results)
	}
	for _, r := range im.Results {
		if r.Granted == 0 || r.Failed() == 0 || r.Calls != r.Granted+r.Failed() {
			t.Errorf("%s: %d calls, %d granted, %d failed; want some of each", r.Name, r.Calls, r.Granted, r.Failed())
		}
		if r.Allowed <= 0 || r.FailedIn.N != r.Failed() || r.Wait.N != r.Granted {
			t.Errorf("%s: figures missing: %+v", r.Name, r)
		}
	}
	sl := im.Results[0]
	if !sl.NoExcess() {
		t.Errorf("sluice over the limit: by grant time %d, by start time (windows %v longer) %d", sl.Excess, bucketSlack(), sl.ExcessSlack)
	}
	if sl.Errors != 0 {
		t.Errorf("sluice: %d calls failed other than for lack of time; first: %s", sl.Errors, sl.Err)
	}

	var table bytes.Buffer
	tw := newTable(&table, "impatient")
	im.table(tw, Limit{})
	tw.Flush()
	for _, w := range []string{"IMPATIENT", "side by side", "sluice", "redis_rate", "utilization", "goal ≥ 0.9", "failed call: time from its arrival, p50",
		"goal ≤ 10 ms", "granted call: wait, p50", "excess over the limit", "goal 0", "windows 27 ms longer"} {
		if !strings.Contains(table.String(), w) {
			t.Errorf("table lacks %q:\n%s", w, table.String())
		}
	}
}

// TestImpatientRefusesBadFlags: its flags are checked before anything
// runs.
func TestImpatientRefusesBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--scenario", "impatient", "--impatient-deadline", "0s"}, "--impatient-deadline 0s"},
		{[]string{"--scenario", "impatient", "--impatient-backoff", "-1s"}, "--impatient-backoff -1s"},
		{[]string{"--scenario", "impatient", "--impatient-rate", "0"}, "--impatient-rate 0"},
		{[]string{"--scenario", "impatient", "--impatient-burst", "0"}, "--impatient-burst 0"},
		{[]string{"--scenario", "impatient", "--impatient-procs", "5", "--impatient-callers", "4"}, "--impatient-procs 5"},
		{[]string{"--scenario", "saturate", "--impatient-apart"}, "--impatient-apart is a flag of the impatient scenario"},
	} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), tc.args, &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}

// TestJudgeCountsEachGrantOnce judges calls made by hand: each grant's
// claims, refunds and retimes count once, and the settled utilization
// counts the starts from the run's first second on against the refills
// over that span.
func TestJudgeCountsEachGrantOnce(t *testing.T) {
	l := guarantee.Limit{Capacity: 2, RefillAmount: 1, RefillFrequency: 100 * time.Millisecond}
	begin := time.Unix(1_800_000_000, 0)
	var calls []callRecord
	for i := range 30 { // one start every 100 ms, from 0 to 2.9 s
		at := begin.Add(time.Duration(i) * 100 * time.Millisecond)
		calls = append(calls, callRecord{Start: at.Add(-time.Millisecond).UnixNano(), End: at.UnixNano(), Slot: at.UnixMicro(), Claims: 1, Refunds: 1, Retimes: 2})
	}
	var run LimiterRun
	run.judge(calls, l, begin, 3*time.Second)
	if run.Granted != 30 || run.Claims != 30 || run.Refunds != 30 || run.Retimes != 60 {
		t.Errorf("granted %d, claims %d, refunds %d, retimes %d: want 30, 30, 30, 60", run.Granted, run.Claims, run.Refunds, run.Retimes)
	}
	// From 1 s on: the starts at 1.0 … 2.9 s, 20 of them, against 20 refills.
	if run.Settled != 1 {
		t.Errorf("settled utilization %.3f, want 1 (20 starts from 1 s on, 20 refills)", run.Settled)
	}
	var short LimiterRun
	short.judge(calls[:10], l, begin, time.Second)
	if short.Settled != 0 {
		t.Errorf("a run of 1 s: settled utilization %.3f, want 0 (none)", short.Settled)
	}
}
