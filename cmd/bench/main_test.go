package main

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/internal/loadgen"
	"github.com/sluicehq/sluice/internal/redistest"
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
			want = append(want, "all = overhead,scripts,saturate,semaphore,compare", "chaos [flags]", "-compare-callers int", "-scale-procs int", "-plot FILE")
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

// TestAllTable runs both scenarios in one process and checks that the
// table and the benchstat lines carry every section.
func TestAllTable(t *testing.T) {
	if testing.Short() {
		t.Skip("the overhead scenario takes a few seconds")
	}
	srv := redistest.New(t)
	for _, tc := range []struct {
		flag string
		want []string
	}{
		{"", []string{"OVERHEAD", "SCRIPTS", "SATURATE", "QUOTA", "PING round trip", "utilization", "grants overtaken, by slot", "one-line script, same pace"}},
		{"--gobench", []string{"BenchmarkOverhead/enter ", "BenchmarkScripts/poll-slot-found ", "BenchmarkSaturate ", " utilization ", " round-trips/op"}},
	} {
		args := []string{"--redis", srv.URL(), "--duration", "500ms", "--callers", "20", "--procs", "1", "--quota-duration", "500ms", "--quota-callers", "20", "--quota-procs", "1", "--compare-duration", "500ms", "--limits-phase", "300ms", "--limits-callers", "20", "--limits-procs", "1"}
		if tc.flag != "" {
			args = append(args, tc.flag)
		}
		var stdout, stderr bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // a bound on a hang, not a speed goal
		err := run(ctx, args, &stdout, &stderr)
		cancel()
		if err != nil {
			t.Fatalf("run %q: %v\n%s", tc.flag, err, stderr.String())
		}
		for _, w := range tc.want {
			if !strings.Contains(stdout.String(), w) {
				t.Errorf("output of %q lacks %q:\n%s", tc.flag, w, stdout.String())
			}
		}
	}
}

// TestScriptsScenario: every call of the bucket is measured, each costs
// Redis something, and the direct poll (two plain commands) costs less
// than any script that runs four: a ratio within one run.
func TestScriptsScenario(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	var stdout, stderr bytes.Buffer
	if err := run(context.Background(), []string{"--redis", srv.URL(), "--scenario", "scripts", "--json"}, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	rep := decode(t, stdout.Bytes())
	if rep.Scripts == nil || len(rep.Scripts.Rows) != 7 {
		t.Fatalf("want 7 rows: %s", stdout.String())
	}
	byName := map[string]ScriptCost{}
	for _, r := range rep.Scripts.Rows {
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
