package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

func TestMain(m *testing.M) {
	loadgen.MaybeWorker() // the saturate scenario re-executes this test binary
	goleak.VerifyTestMain(m)
}

// decoded is the --json report, read back.
type decoded struct {
	Limit     Limit      `json:"limit"`
	Overhead  *Overhead  `json:"overhead"`
	Scripts   *Scripts   `json:"scripts"`
	Saturate  *Saturate  `json:"saturate"`
	Semaphore *Semaphore `json:"semaphore"`
	Compare   *Compare   `json:"compare"`
	Scale     *Scale     `json:"scale"`
	Chaos     *Chaos     `json:"chaos"`
}

func decode(t *testing.T, out []byte) decoded {
	t.Helper()
	var rep decoded
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("output is not JSON: %v\n%s", err, out)
	}
	return rep
}

// TestParseRefusesBadFlags: each bad command line is refused before
// anything runs, with an error that names the flag.
func TestParseRefusesBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--scenario", "nope"}, `no scenario "nope"`},
		{[]string{"--callers", "0"}, "--callers 0"},
		{[]string{"--procs", "5", "--callers", "4"}, "--procs 5"},
		{[]string{"--duration", "0s"}, "--duration 0s"},
		{[]string{"--capacity", "0"}, "--capacity 0"},
		{[]string{"--refill-amount", "51"}, "--refill-amount 51"},
		{[]string{"--refill-frequency", "1500ns"}, "--refill-frequency 1.5µs"},
		{[]string{"--json", "--gobench"}, "exclusive"},
		{[]string{"extra"}, "unexpected arguments"},
		{[]string{"--nope"}, "-nope"},
		{[]string{"--scenario", "overhead", "--plot", "x.svg"}, "--plot is a flag of the saturate scenario"},
		{[]string{"--scenario", "overhead", "--scale-callers", "10"}, "--scale-callers is a flag of the scale scenario"},
		{[]string{"chaos", "--duration", "1s"}, "--duration 1s"},
		{[]string{"chaos", "--scenario", "overhead"}, "-scenario"},
	} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), tc.args, &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want an error containing %q", tc.args, err, tc.want)
		}
		if stdout.Len() > 0 {
			t.Errorf("run(%q) wrote to stdout: %s", tc.args, stdout.String())
		}
	}
}

// TestHelp: --help succeeds (main exits 0) and writes to stdout what a
// new user needs: every scenario with its rough duration, which are in
// all, the chaos subcommand, and what the bench starts on this machine.
func TestHelp(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"chaos", "--help"}} {
		var stdout, stderr bytes.Buffer
		if err := run(context.Background(), args, &stdout, &stderr); err != nil {
			t.Fatalf("run(%q): %v", args, err)
		}
		out := stdout.String()
		want := []string{"redis-server", "worker processes", "-redis URL", "-capacity int"}
		if args[0] == "chaos" {
			want = append(want, "-seed uint", "-duration duration", "kills, pauses and")
		} else {
			for _, s := range scenarios() {
				a := s.about()
				want = append(want, a.name+" ", a.takes, a.what)
			}
			want = append(want, "all = overhead,scripts,saturate,semaphore,compare", "chaos [flags]", "-compare-callers int", "-scale-procs int", "-plot FILE", "-change-carry RULE",
				"-check", "Words in the report", "grant time", "retime", "re-entry", "utilization", "windows N longer")
		}
		for _, w := range want {
			if !strings.Contains(out, w) {
				t.Errorf("run(%q) output lacks %q:\n%s", args, w, out)
			}
		}
	}
}

// TestSaturateJSON runs a short saturated run in two worker processes and
// checks the figures that must hold on any machine.
func TestSaturateJSON(t *testing.T) {
	srv := redistest.New(t)
	var stdout, stderr bytes.Buffer
	args := []string{"--redis", srv.URL(), "--scenario", "saturate", "--duration", "1s",
		"--callers", "40", "--procs", "2", "--capacity", "10", "--refill-frequency", "5ms", "--json"}
	if err := run(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	rep := decode(t, stdout.Bytes())
	s := rep.Saturate
	if s == nil || rep.Overhead != nil {
		t.Fatalf("want only the saturate scenario: %s", stdout.String())
	}
	// 10 at once, then 200/s for about a second.
	if s.Grants < 100 || s.Errors != 0 {
		t.Errorf("%d grants, %d errors (%s); want > 100 and none", s.Grants, s.Errors, s.Err)
	}
	if s.ExcessSlots.All > 0 || s.OvertakenSlot != 0 || s.Early != 0 {
		t.Errorf("slots: excess %d, overtaken %d, early %d; want ≤ 0, 0, 0", s.ExcessSlots.All, s.OvertakenSlot, s.Early)
	}
	if s.RoundTrips <= s.Steps || s.Steps == 0 || s.CallerRoundTrips < int64(s.Grants) {
		t.Errorf("round trips: %d counted by hooks, %d by callers, %d steps", s.RoundTrips, s.CallerRoundTrips, s.Steps)
	}
}

// TestAll runs every scenario of --scenario all once, each cut short, in
// one process, and writes the one report three ways: the table and the
// benchstat lines carry every section, the JSON decodes, and --check's
// verdict names as many goals as the table says were not met. On
// redis-server it also checks the scripts scenario's figures: every call
// of the bucket is measured, each costs Redis something, and the direct
// poll (two plain commands) costs less than any script that runs four.
func TestAll(t *testing.T) {
	if testing.Short() {
		t.Skip("every scenario, shortened, takes about a minute")
	}
	srv := redistest.New(t)
	args := []string{"--redis", srv.URL(), "--duration", "500ms", "--callers", "20", "--procs", "1",
		"--quota-duration", "500ms", "--quota-callers", "20", "--quota-procs", "1",
		"--compare-duration", "300ms", "--compare-callers", "20",
		"--change-phase", "300ms", "--change-callers", "20", "--change-procs", "1",
		"--tenants-buckets", "20", "--tenants-semaphores", "2", "--tenants-callers", "2", "--tenants-idle", "200ms",
		"--overload-duration", "500ms", "--overload-callers", "20", "--overload-procs", "2",
		"--churn-duration", "500ms", "--churn-cases", "calm-exit",
		"--impatient-duration", "500ms", "--impatient-callers", "20", "--impatient-procs", "1",
		"--pods-duration", "500ms", "--pods-callers", "8", "--pods-procs", "1",
		"--sidecar-duration", "300ms", "--sidecar-callers", "20", "--sidecar-uncontended", "50",
		"--lanes-duration", "500ms", "--lanes-procs", "2", "--lanes-tenants", "100"}
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute) // a bound on a hang, not a speed goal
	rep, com, err := measure(ctx, args, &stdout, &stderr)
	cancel()
	if err != nil {
		t.Fatalf("measure: %v\n%s", err, stderr.String())
	}
	if com.check || com.json || com.gobench {
		t.Errorf("flags not given are set: %+v", com)
	}
	var want []string
	for _, s := range scenarios() {
		if s.about().all {
			want = append(want, s.about().name)
		}
	}
	var got []string
	for _, s := range rep.Scenarios {
		got = append(got, s.about().name)
	}
	if !slices.Equal(got, want) {
		t.Fatalf("ran %q, want --scenario all's %q", got, want)
	}

	var table, bench, js bytes.Buffer
	if err := writeTable(&table, *rep); err != nil {
		t.Fatal(err)
	}
	if err := writeGobench(&bench, *rep); err != nil {
		t.Fatal(err)
	}
	if err := writeJSON(&js, *rep); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"OVERHEAD", "SCRIPTS", "SATURATE", "SEMAPHORE", "COMPARE", "QUOTA", "POLICY CHANGE", "TENANTS", "LANES", "OVERLOAD", "CHURN",
		"PING round trip", "utilization", "grants overtaken, by grant time", "one-line script, same pace",
		"late callers (retimes)", "queued again at the back (re-entries)"} {
		if !strings.Contains(table.String(), w) {
			t.Errorf("the table lacks %q:\n%s", w, table.String())
		}
	}
	for _, w := range []string{"BenchmarkOverhead/enter ", "BenchmarkScripts/poll-slot-found ", "BenchmarkSaturate ", "BenchmarkSemaphore/saturated ",
		"BenchmarkCompare/sluice/saturated ", "BenchmarkCompare/redis_rate/uncontended ", "BenchmarkQuota ", "BenchmarkPolicyChange/", "BenchmarkTenants/callers=2 ", "BenchmarkLanes/fair ", "BenchmarkOverload ",
		"BenchmarkChurn/calm-exit ", " utilization ", " round-trips/op", " retimes "} {
		if !strings.Contains(bench.String(), w) {
			t.Errorf("the benchstat lines lack %q:\n%s", w, bench.String())
		}
	}
	dec := decode(t, js.Bytes())
	if dec.Overhead == nil || dec.Scripts == nil || dec.Saturate == nil || dec.Compare == nil || dec.Scale != nil {
		t.Errorf("JSON sections: %s", js.String())
	}

	notMet := strings.Count(table.String(), ": NOT MET")
	switch err := goalsMet(*rep); {
	case notMet == 0 && err != nil:
		t.Errorf("no goal NOT MET in the table, yet --check says %v", err)
	case notMet > 0 && (err == nil || !strings.HasPrefix(err.Error(), fmt.Sprintf("%d goal", notMet))):
		t.Errorf("%d goals NOT MET in the table, --check says %v", notMet, err)
	}

	if srv.Fake() {
		return // miniredis's figures say nothing of Redis's costs
	}
	sc := rep.Scenarios[slices.Index(got, "scripts")].(*Scripts)
	if len(sc.Rows) != 8 {
		t.Fatalf("want 8 rows of scripts: %+v", sc.Rows)
	}
	byName := map[string]ScriptCost{}
	for _, r := range sc.Rows {
		if r.Tight <= 0 || r.Paced <= 0 {
			t.Errorf("%s: %.2f µs tight, %.2f µs paced; want both > 0", r.Name, r.Tight, r.Paced)
		}
		byName[r.Name] = r
	}
	for _, name := range []string{"enqueue, 3 policies, cost, granted", "enqueue, 3 policies, cost, queued"} {
		if _, ok := byName[name]; !ok {
			t.Errorf("no row %q", name)
		}
	}
	poll, enq := byName["poll, slot found"], byName["enqueue, queued"]
	if poll.Tight >= enq.Tight {
		t.Errorf("a direct poll cost %.2f µs, a queued enqueue %.2f µs: want the poll cheaper", poll.Tight, enq.Tight)
	}
}

// TestCheck: --check's verdict names each goal a table says was not met,
// by its scenario and row (and the row it is indented under), and none
// when all were met.
func TestCheck(t *testing.T) {
	missed := &Overload{Saturation: Saturation{Throughput: Throughput{Utilization: 0.5}, ExcessSlots: Excess{All: 1}}}
	met := &Overload{Saturation: Saturation{Throughput: Throughput{Utilization: 1}, ExcessSlots: Excess{All: -3}}}
	tenants := &Tenants{Rows: []TenantsRow{
		{Callers: 3, BucketCallers: 6, Granted: 6, LastGrant: 3 * time.Second, Ideal: time.Second, Pool: 10, ConnsPeak: 4},
		{Callers: 8, BucketCallers: 16, Granted: 16, LastGrant: time.Second, Ideal: time.Second, Pool: 10, ConnsPeak: 4, CommandsPerSec: 9},
	}}
	err := goalsMet(Report{Scenarios: []scenario{met, tenants, missed}})
	want := "4 goals not met: tenants 3 callers a handle last grant; tenants 8 callers a handle Redis commands/s, idle; overload utilization; overload excess over the limit"
	if err == nil || err.Error() != want {
		t.Errorf("goalsMet = %v\nwant        %s", err, want)
	}
	if err := goalsMet(Report{Scenarios: []scenario{met}}); err != nil {
		t.Errorf("every goal met: goalsMet = %v, want nil", err)
	}
	// One row, two goals: each is named with what it wanted.
	up := &Upstream{Rows: []UpstreamRow{{Case: "at-limit", Feedback: "hold", Arrivals: 100, Refused: 50}}}
	want = "2 goals not met: upstream at-limit (429s ≤ 0.1 %); upstream at-limit (utilization ≥ 0.99)"
	if err := goalsMet(Report{Scenarios: []scenario{up}}); err == nil || err.Error() != want {
		t.Errorf("goalsMet = %v\nwant        %s", err, want)
	}
}

// TestCheckExits: a tenants run whose callers' deadline is shorter than
// their turn cannot meet "all granted"; with --check the run is an error
// naming that goal, after the report; without it, the same run is not.
func TestCheckExits(t *testing.T) {
	srv := redistest.New(t)
	args := []string{"--redis", srv.URL(), "--scenario", "tenants", "--tenants-buckets", "4", "--tenants-semaphores", "1",
		"--tenants-callers", "3", "--tenants-idle", "100ms", "--tenants-deadline", "50ms"} // 5/s, burst 1: the third waits 400 ms
	for _, check := range []bool{false, true} {
		a := args
		if check {
			a = append(slices.Clone(args), "--check")
		}
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), a, &stdout, &stderr)
		if !strings.Contains(stdout.String(), "all granted, ≤ 1.5× the ideal: NOT MET") {
			t.Fatalf("check %v: the report lacks the goal not met (%v):\n%s", check, err, stdout.String())
		}
		switch {
		case !check && err != nil:
			t.Errorf("without --check: %v, want nil", err)
		case check && (err == nil || !strings.Contains(err.Error(), "not met: tenants 3 callers a handle last grant")):
			t.Errorf("with --check: %v, want an error naming the goal", err)
		}
	}
}
