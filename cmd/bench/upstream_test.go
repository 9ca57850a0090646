package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testing/guarantee"
	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/internal/testing/upstreamtest"
)

// TestUpstreamScenario runs the upstream scenario's plain cases briefly
// in two worker processes and checks what must hold on any machine: every case and mode
// ran without errors, the upstream saw requests in each, a fed-back fleet
// sent nothing during the outage's hold beyond what was already on its
// way, and the table carries the goals. Speeds are not judged here. The
// outage case (7 s a mode) runs beside the others, each on a
// redis-server and an upstream of its own: the test mostly waits.
func TestUpstreamScenario(t *testing.T) {
	t.Parallel()
	// The -openai and rolling cases have tests of their own
	// (TestUpstreamAdapt, TestUpstreamRolling), which judge them longer.
	for _, tc := range []struct {
		cases string
		rows  int
		table []string
	}{
		{"at-limit,at-limit-headroom,at-limit-cold,25pct-over", 8, []string{"UPSTREAM", "at-limit", "at-limit-cold", "25pct-over", "goal 429s ≤ 0.1 %", "goal no 429", "goal utilization ≥ 0.9"}},
		{"outage", 3, []string{"UPSTREAM", "outage", "requests during the 2s hold"}},
	} {
		t.Run(tc.cases, func(t *testing.T) {
			t.Parallel()
			u := runUpstream(t, tc.cases, "1s", 8)
			if len(u.Rows) != tc.rows {
				t.Fatalf("%d rows, want %d: %+v", len(u.Rows), tc.rows, u.Rows)
			}
			checkUpstreamRows(t, u.Rows)
			var table bytes.Buffer
			tw := newTable(&table, "upstream")
			u.table(tw, Limit{})
			tw.Flush()
			for _, w := range tc.table {
				if !strings.Contains(table.String(), w) {
					t.Errorf("table lacks %q:\n%s", w, table.String())
				}
			}
		})
	}
}

// checkUpstreamRows: every row ran without errors and the upstream
// accepted requests in it; an outage row saw the outage, and a fed-back
// fleet sent nothing during its hold beyond what was on its way.
func checkUpstreamRows(t *testing.T, rows []UpstreamRow) {
	t.Helper()
	for _, r := range rows {
		if r.Errors > 0 || r.Accepted == 0 {
			t.Errorf("%s, feedback %s: %d accepted, %d errors (%s)", r.Case, r.Feedback, r.Accepted, r.Errors, r.Err)
		}
		o := r.Outage
		if r.Case != "outage" {
			continue
		}
		if o == nil || o.Unavailable == 0 {
			t.Errorf("outage, feedback %s: the outage refused nothing", r.Feedback)
			continue
		}
		// Under a loaded CI machine a request granted before the hold
		// may cross loopback late: allow it 100 ms, not the 2 s hold.
		if r.Feedback != fbOff && o.DuringHold > o.InFlight+2 {
			t.Errorf("outage, feedback %s: %d requests during the hold, %d of them on their way", r.Feedback, o.DuringHold, o.InFlight)
		}
	}
}

// TestUpstreamAdapt runs the cases whose upstream says its rate (OpenAI's
// headers) for 5 s in two worker processes and judges Adapt's rows
// against the scenario's goals, loosened for a short run on a loaded
// machine: 25 % above the upstream, Adapt steps to its rate at the first
// refusal and holds until a request is back, so that few requests are
// refused and most of the quota is used (a hold of the whole Retry-After
// per refusal, and steps of × 0.85, used about 0.6 of it); at its limit,
// nearly nothing is refused and nearly all is used.
func TestUpstreamAdapt(t *testing.T) {
	t.Parallel()
	// Each case on a redis-server and an upstream of its own, beside the
	// other: the runs mostly wait.
	for _, c := range []string{"at-limit-openai", "25pct-over-openai"} {
		t.Run(c, func(t *testing.T) {
			t.Parallel()
			rows := runUpstream(t, c, "5s", 16).Rows
			judged := 0
			for _, r := range rows {
				share := per(int64(r.Refused), r.Arrivals)
				t.Logf("%s, feedback %s: %d refused of %d (%.2f %%), utilization %.4f, rate left at %.1f/s",
					r.Case, r.Feedback, r.Refused, r.Arrivals, 100*share, r.Utilization, r.Slowed)
				if r.Case != c {
					t.Errorf("row of case %s, want only %s", r.Case, c)
				}
				if r.Feedback != fbAdapt {
					continue
				}
				judged++
				if r.Errors > 0 {
					t.Errorf("%s: %d errors, first: %s", r.Case, r.Errors, r.Err)
				}
				switch r.Case {
				case "25pct-over-openai":
					// Goals 1 % and 0.9.
					if share > 0.02 || r.Utilization < 0.85 {
						t.Errorf("25 %% above an upstream that says its rate, with Adapt: %.2f %% refused, utilization %.4f; want ≤ 2 %% and ≥ 0.85",
							100*share, r.Utilization)
					}
				case "at-limit-openai":
					// Goals 0.1 % and 0.99. Run alone this case saw 0, 0
					// and 1 refused of 512-518; in CI, beside the other
					// packages' tests, 2 of 513 and 3 of 505 (0.59 %): a
					// request that reaches the upstream a trip's jitter
					// ahead of its refill at the exact limit. A lag that
					// covers the trip is the cure (the open issue on the
					// upstream's books); until then, 1 %.
					if share > 0.01 || r.Utilization < 0.95 {
						t.Errorf("at the limit of an upstream that says its rate, with Adapt: %.2f %% refused, utilization %.4f; want ≤ 1 %% and ≥ 0.95",
							100*share, r.Utilization)
					}
				}
			}
			if judged != 1 {
				t.Fatalf("%d rows with Adapt, want 1: %+v", judged, rows)
			}
		})
	}
}

// runUpstream runs the upstream scenario's cases (comma-separated) for d
// each, with callers in two worker processes, and returns its figures.
func runUpstream(t *testing.T, cases, d string, callers int) *Upstream {
	t.Helper()
	srv := redistest.New(t)
	srv.RequireReal(t)
	var stdout, stderr bytes.Buffer
	args := []string{"--redis", srv.URL(), "--scenario", "upstream", "--upstream-cases", cases,
		"--upstream-duration", d, "--upstream-procs", "2", "--upstream-callers", strconv.Itoa(callers), "--json"}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // a bound on a hang, not a speed goal
	defer cancel()
	if err := run(ctx, args, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	var rep struct {
		Upstream *Upstream `json:"upstream"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil || rep.Upstream == nil {
		t.Fatalf("no upstream figures (%v): %s", err, stdout.String())
	}
	return rep.Upstream
}

// judgeOutage on made-up arrivals: the hold starts at the first 503,
// arrivals inside it are counted, those within upstreamInFlight apart.
func TestJudgeOutage(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(d time.Duration, status int) upstreamtest.Arrival {
		return upstreamtest.Arrival{At: t0.Add(d), Status: status}
	}
	arrivals := []upstreamtest.Arrival{
		at(0, 200),
		at(100*time.Millisecond, 200),
		at(200*time.Millisecond, 503), // the hold: until 2.2 s
		at(210*time.Millisecond, 503), // on its way
		at(900*time.Millisecond, 503), // during the hold
		at(2200*time.Millisecond, 200),
		at(2300*time.Millisecond, 200),
	}
	lim := guarantee.Limit{Capacity: 1, RefillAmount: 1, RefillFrequency: 100 * time.Millisecond}
	o := judgeOutage(arrivals, 2*time.Second, lim, 0)
	want := UpstreamOutage{RetryAfter: 2 * time.Second, Unavailable: 3, DuringHold: 2, InFlight: 1, After: 2, Excess: o.Excess}
	if *o != want {
		t.Errorf("got %+v, want %+v", *o, want)
	}
	if o.Excess > 0 {
		t.Errorf("excess %d over a limit of 1 every 100 ms with capacity 1", o.Excess)
	}
	r := judgeUpstream(arrivals, 10, 1)
	if r.Accepted != 4 || r.Refused != 0 || r.Arrivals != 7 || r.Span != 2300*time.Millisecond {
		t.Errorf("judgeUpstream: %+v", r)
	}
}

// TestUpstreamRolling runs the rolling-window cases for 3 s in two worker
// processes: against an upstream that allows its rate in any rolling
// second, a rolling window at that limit is (almost) never refused and
// uses clearly more of it than a token bucket of that rate and burst.
// Loose bounds for a loaded machine; the scenario's own goals are no 429
// and 0.98 (0 of 2,000 and 0.9947 on a quiet machine, 20 s).
func TestUpstreamRolling(t *testing.T) {
	rows := runUpstream(t, "rolling-window,rolling-as-rate", "3s", 16).Rows
	if len(rows) != 2 {
		t.Fatalf("%d rows, want 2: %+v", len(rows), rows)
	}
	rolling, rate := rows[0], rows[1]
	for _, r := range rows {
		t.Logf("%s: %d of %d refused, utilization %.4f", r.Case, r.Refused, r.Arrivals, r.Utilization)
		if r.Errors > 0 {
			t.Errorf("%s: %d errors, first: %s", r.Case, r.Errors, r.Err)
		}
	}
	if rolling.Case != "rolling-window" || rate.Case != "rolling-as-rate" {
		t.Fatalf("rows %s, %s", rolling.Case, rate.Case)
	}
	// A request that reaches the upstream more than the window's lag
	// (5 ms) after its slot may be refused: under -race, with 16 callers
	// sending through HTTP, some do even on a quiet host (6, 7, 12 and 7
	// of 216 in four runs of this test alone on the code before callers
	// were refused for their deadlines, 9, 7, 7, 9 and 11 after; 4 of 218
	// beside a busy loop): each refusal then holds the fleet a second. A
	// lag that covers the request's trip is the cure (the upstream's
	// books, not only ours); until then the bound is what this host
	// shows, and the rolling window must still beat the token bucket
	// clearly.
	if rolling.Refused*100 > 8*rolling.Arrivals {
		t.Errorf("rolling window at the limit: %d of %d refused; want ≤ 8 %%", rolling.Refused, rolling.Arrivals)
	}
	if rolling.Utilization < rate.Utilization+0.1 {
		t.Errorf("rolling window at the limit used %.4f of the upstream, a token bucket at its rate %.4f: want 0.1 more", rolling.Utilization, rate.Utilization)
	}
}
