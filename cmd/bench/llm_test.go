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

// TestLlmScenario runs the llm scenario briefly in two worker processes
// and checks what must hold even on a loaded machine: no errors, the
// upstream refused at most 2 % of the settled calls (with headroom, and
// with the bucket at the upstream's bursts on cold connections, where a
// quiet machine refuses none), and settling at the
// usage used clearly more of the upstream's tokens than charging the
// estimate did (about 0.97 against 0.62 on a quiet machine; a 429 holds
// every caller for a second, which in so short a run costs a quarter of
// it, hence the loose bounds).
func TestLlmScenario(t *testing.T) {
	// It mostly waits: it runs beside the upstream runs.
	t.Parallel()
	srv := redistest.New(t)
	srv.RequireReal(t)
	var stdout, stderr bytes.Buffer
	args := []string{"--redis", srv.URL(), "--scenario", "llm", "--llm-duration", "4s",
		"--llm-procs", "2", "--llm-callers", "16", "--json"}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute) // a bound on a hang, not a speed goal
	defer cancel()
	if err := run(ctx, args, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	var rep struct {
		LLM *LLM `json:"llm"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil || rep.LLM == nil {
		t.Fatalf("no llm figures (%v): %s", err, stdout.String())
	}
	rows := rep.LLM.Rows
	if len(rows) != 3 || rows[0].Charge != llmSettle || rows[1].Charge != llmEstimate || rows[2].Charge != llmExactCold {
		t.Fatalf("rows %+v, want the settled run, the estimate's, then the exact cold one", rows)
	}
	for _, r := range rows {
		t.Logf("charging %s: %d calls, %d refused, %d of %.0f tokens used: %.4f", r.Charge, r.Arrivals, r.Refused, r.Used, r.Quota, r.Utilization)
		if r.Errors > 0 || r.Accepted == 0 {
			t.Errorf("charging %s: %d accepted, %d errors (%s)", r.Charge, r.Accepted, r.Errors, r.Err)
		}
	}
	settled, estimate := rows[0], rows[1]
	for _, r := range []LLMRow{settled, rows[2]} {
		if share := per(int64(r.Refused), r.Arrivals); share > 0.02 {
			t.Errorf("%s: %d of %d calls refused (%.2f %%), want ≤ 2 %%", r.Charge, r.Refused, r.Arrivals, 100*share)
		}
	}
	if settled.Utilization < estimate.Utilization+0.1 || settled.Utilization > 1.02 {
		t.Errorf("settled: %.4f of the token quota used, the estimate alone %.4f: want the settled run at least 0.1 above, and not over the quota",
			settled.Utilization, estimate.Utilization)
	}
	if estimate.Utilization > 0.8 {
		t.Errorf("the estimate alone used %.4f of the token quota: want the output's unused tokens lost (about 0.6)", estimate.Utilization)
	}
}

// TestLlmGoals: the table says the settled run's goals in words, and
// --check names each one not met; the contrast row has none.
func TestLlmGoals(t *testing.T) {
	l := &LLM{Requests: 60, Tokens: 20_000, Callers: 32, Procs: 4, Latency: 100 * time.Millisecond, Rows: []LLMRow{
		{Charge: llmSettle, Arrivals: 1000, Accepted: 990, Refused: 10, Used: 90, Quota: 100, Utilization: 0.9},
		{Charge: llmEstimate, Arrivals: 600, Accepted: 600, Used: 60, Quota: 100, Utilization: 0.6},
	}}
	var out bytes.Buffer
	tw := newTable(&out, "llm")
	l.table(tw, Limit{})
	tw.Flush()
	for _, w := range []string{"LLM", "tokens used / the upstream's token quota", "refused (429)", "0.9000", "1.00 % of 1,000",
		"goal tokens used ≥ 0.95 of the quota: NOT MET", "goal refused ≤ 0.5 %: NOT MET", "no goal: for contrast"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("the table lacks %q:\n%s", w, out.String())
		}
	}
	want := "2 goals not met: llm reserved, then settled at its usage (tokens used ≥ 0.95 of the quota); llm reserved, then settled at its usage (refused ≤ 0.5 %)"
	if err := goalsMet(Report{Scenarios: []scenario{l}}); err == nil || err.Error() != want {
		t.Errorf("goalsMet = %v\nwant        %s", err, want)
	}
	l.Rows[0].Utilization, l.Rows[0].Refused = 0.97, 0
	if err := goalsMet(Report{Scenarios: []scenario{l}}); err != nil {
		t.Errorf("every goal met: goalsMet = %v", err)
	}
}
