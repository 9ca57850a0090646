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

// TestChurnScenario runs two cases of the churn scenario for a second
// each (one pace and one variant each) and checks what must hold on any
// machine: every process reported a grant, the limit held for every
// grant, a FIFO queue's waits were computed, and the table has its rows
// and goals. Utilization and waits are the bench's to judge, not this
// test's.
func TestChurnScenario(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	var stdout, stderr bytes.Buffer
	args := []string{"--redis", srv.URL(), "--scenario", "churn", "--churn-duration", "1s",
		"--churn-cases", "calm-exit,busy-close", "--json"}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // a bound on a hang, not a speed goal
	defer cancel()
	if err := run(ctx, args, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	var rep struct {
		Churn *Churn `json:"churn"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil || rep.Churn == nil {
		t.Fatalf("no churn figures (%v): %s", err, stdout.String())
	}
	c := rep.Churn
	if len(c.Rows) != 2 || c.Rows[0].Case != "calm-exit" || c.Rows[1].Case != "busy-close" {
		t.Fatalf("want the cases calm-exit and busy-close: %+v", c.Rows)
	}
	for _, r := range c.Rows {
		if r.Procs < 10 || r.Grants != r.Procs || r.Errors != 0 || r.Failed != 0 {
			t.Errorf("%s: %d of %d processes granted, %d errors, %d reported nothing (%s)", r.Case, r.Grants, r.Procs, r.Errors, r.Failed, r.Err)
		}
		if !r.NoExcess() {
			t.Errorf("%s: over the limit: by slot %d, by start %d", r.Case, r.ExcessSlots.All, r.ExcessStartsSlack)
		}
		if r.FIFO.N != r.Grants || r.Waits.N != r.Grants {
			t.Errorf("%s: %d waits and %d FIFO waits for %d grants", r.Case, r.Waits.N, r.FIFO.N, r.Grants)
		}
	}
	if c.Rows[0].NoClose == 0 || c.Rows[1].NoClose != 0 {
		t.Errorf("calm-exit should have processes exit without Close, busy-close none: %v, %v", c.Rows[0].NoClose, c.Rows[1].NoClose)
	}

	var table bytes.Buffer
	tw := newTable(&table, "churn")
	c.table(tw, Limit{})
	tw.Flush()
	for _, w := range []string{"CHURN", "calm-exit", "busy-close", "utilization", "goal ≥ 90 %", "excess over the limit", "goal 0",
		"wait p50 / p99", "goal p99 ≤ 1.2× the FIFO queue's", "a FIFO queue at the limit", "exit without Close"} {
		if !strings.Contains(table.String(), w) {
			t.Errorf("table lacks %q:\n%s", w, table.String())
		}
	}
}
