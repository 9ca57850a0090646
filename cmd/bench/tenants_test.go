package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// TestTenantsScenario runs the tenants scenario on 50 buckets and 5
// semaphores and checks what must hold on any machine: every caller was
// granted, no bucket went over its limit and no semaphore held more than
// its permit, and the table has every row with its goal. The goals
// themselves are the bench's to judge, not this test's.
func TestTenantsScenario(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	var stdout, stderr bytes.Buffer
	args := []string{"--redis", srv.URL(), "--scenario", "tenants", "--tenants-buckets", "50", "--tenants-semaphores", "5",
		"--tenants-callers", "3,8", "--tenants-idle", "500ms", "--json"}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // a bound on a hang, not a speed goal
	defer cancel()
	if err := run(ctx, args, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	var rep struct {
		Tenants *Tenants `json:"tenants"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil || rep.Tenants == nil {
		t.Fatalf("no tenants figures (%v): %s", err, stdout.String())
	}
	tn := rep.Tenants
	if len(tn.Rows) != 2 || tn.Rows[0].Callers != 3 || tn.Rows[1].Callers != 8 {
		t.Fatalf("want a run of 3 and one of 8 callers a handle: %+v", tn.Rows)
	}
	for _, r := range tn.Rows {
		if r.Granted != 50*r.Callers || r.Errors != 0 {
			t.Errorf("%d callers a handle: %d of %d granted, %d errors (%s)", r.Callers, r.Granted, 50*r.Callers, r.Errors, r.Err)
		}
		if r.Acquired != 5*r.Callers || r.SemaphoreErrors != 0 {
			t.Errorf("%d callers a handle: %d of %d acquired, %d errors", r.Callers, r.Acquired, 5*r.Callers, r.SemaphoreErrors)
		}
		if !r.NoExcess() {
			t.Errorf("%d callers a handle: over the limit: worst bucket by slot %d, by start %d; most permits held %d",
				r.Callers, r.ExcessSlots, r.ExcessStarts, r.MostHeld)
		}
		if r.Ideal <= 0 || r.LastGrant <= 0 || r.ConnsPeak < 1 || r.Pool < 1 {
			t.Errorf("%d callers a handle: figures missing: %+v", r.Callers, r)
		}
	}

	var table bytes.Buffer
	tw := newTable(&table, "tenants")
	tn.table(tw, Limit{})
	tw.Flush()
	for _, w := range []string{"TENANTS", "3 callers a handle", "8 callers a handle", "last grant", "ideal", "re-entries", "retimes",
		"excess over the limit", "Redis connections, most", "goroutines, idle", "heap per idle handle", "Redis commands/s, idle",
		"Close of every handle", "goal ≤ pool + 2", "goal ≤ 50 whatever the count of handles", "goal ≤ 10 KB", "goal ≤ 5",
		"≤ 1.5× the ideal", "≤ 2.0× the ideal", "goal ≤ 1 % of grants"} {
		if !strings.Contains(table.String(), w) {
			t.Errorf("table lacks %q:\n%s", w, table.String())
		}
	}
}

// TestFleetScenariosRefuseBadFlags: the flags of tenants, overload and
// churn are checked before anything runs.
func TestFleetScenariosRefuseBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--scenario", "tenants", "--tenants-callers", "3,0"}, "--tenants-callers"},
		{[]string{"--scenario", "tenants", "--tenants-buckets", "0"}, "--tenants-buckets 0"},
		{[]string{"--scenario", "tenants", "--tenants-pool", "-1"}, "--tenants-pool -1"},
		{[]string{"--scenario", "overload", "--overload-hog", "-1"}, "--overload-hog -1"},
		{[]string{"--scenario", "overload", "--overload-procs", "5", "--overload-callers", "4"}, "--overload-procs 5"},
		{[]string{"--scenario", "churn", "--churn-cases", "calm-close,nope"}, `no case "nope"`},
		{[]string{"--scenario", "churn", "--churn-over", "0"}, "--churn-over 0"},
		{[]string{"--scenario", "saturate", "--churn-duration", "1s"}, "--churn-duration is a flag of the churn scenario"},
	} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), tc.args, &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}
