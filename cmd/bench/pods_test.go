package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// TestPodsScenario runs a short pods run, two pods of 250m, and checks
// what must hold on any machine: sluice and redis_rate each ran in the
// pods and were granted, the pods' cpu.stat was read, sluice held the
// limit by grant time and by start time, and the cgroups are gone after
// the run. Where no cgroup can be made (not root, no cpu controller) the
// scenario says why, and so does this test as it skips. Utilization is
// the bench's to judge, not this test's.
func TestPodsScenario(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	var stdout, stderr bytes.Buffer
	args := []string{"--redis", srv.URL(), "--scenario", "pods", "--json",
		"--pods-duration", "1s", "--pods-procs", "2", "--pods-callers", "20", "--pods-rate", "50", "--pods-burst", "5"}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // a bound on a hang, not a speed goal
	defer cancel()
	if err := run(ctx, args, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	var rep struct {
		Pods *Pods `json:"pods"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil || rep.Pods == nil {
		t.Fatalf("no pods figures (%v): %s", err, stdout.String())
	}
	p := rep.Pods
	var table bytes.Buffer
	tw := newTable(&table, "pods")
	p.table(tw, Limit{})
	tw.Flush()
	if p.Skipped != "" {
		if len(p.Results) != 0 || !strings.Contains(table.String(), "skipped") || !strings.Contains(table.String(), p.Skipped) {
			t.Errorf("skipped (%s), yet results %+v or a table without the reason:\n%s", p.Skipped, p.Results, table.String())
		}
		t.Skipf("pods skipped: %s", p.Skipped)
	}
	if len(p.Results) != 2 || p.Results[0].Name != limSluice || p.Results[1].Name != limRedisRate {
		t.Fatalf("want sluice's run, then redis_rate's: %+v", p.Results)
	}
	for _, r := range p.Results {
		if r.Granted == 0 || r.Periods == 0 {
			t.Errorf("%s: %d granted, %d CFS periods in the pods; want some of each", r.Name, r.Granted, r.Periods)
		}
	}
	sl := p.Results[0]
	if !sl.NoExcess() {
		t.Errorf("sluice over the limit: by grant time %d, by start time (windows %v longer) %d", sl.Excess, bucketSlack(), sl.ExcessSlack)
	}
	if sl.Errors != 0 {
		t.Errorf("sluice: %d errors; first: %s", sl.Errors, sl.Err)
	}
	if len(p.Cgroups) != 2 || p.GOMAXPROCS[0] < 1 {
		t.Errorf("cgroups %q, GOMAXPROCS %v: want 2 pods, each with a Go runtime that reported", p.Cgroups, p.GOMAXPROCS)
	}
	for _, dir := range p.Cgroups {
		if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup %s still there after the run (%v)", dir, err)
		}
	}
	for _, w := range []string{"PODS", "limits.cpu 250m", "sluice", "redis_rate", "utilization", "goal ≥ 0.9", "≥ 0.95 × redis_rate's",
		"excess over the limit, by grant time", "goal 0", "windows 27 ms longer", "throttled: periods", "throttled: time a pod", "retimes", "GOMAXPROCS"} {
		if !strings.Contains(table.String(), w) {
			t.Errorf("table lacks %q:\n%s", w, table.String())
		}
	}
}

// TestParseCPUStat reads both versions' cpu.stat: v1 counts throttled
// time in ns, v2 in µs.
func TestParseCPUStat(t *testing.T) {
	v1 := "nr_periods 30\nnr_throttled 24\nthrottled_time 1500000000\nnr_bursts 0\nburst_time 0\n"
	v2 := "usage_usec 820000\nuser_usec 700000\nsystem_usec 120000\nnr_periods 30\nnr_throttled 24\nthrottled_usec 1500000\n"
	want := cpuStat{Periods: 30, Throttled: 24, Time: 1500 * time.Millisecond}
	for _, text := range []string{v1, v2} {
		if got := parseCPUStat(text); got != want {
			t.Errorf("parseCPUStat(%q) = %+v, want %+v", text, got, want)
		}
	}
}

// TestCgroupPath finds this process's cgroup in /proc/self/cgroup, for
// v1's cpu controller (alone or shared with cpuacct) and for v2.
func TestCgroupPath(t *testing.T) {
	for _, tc := range []struct{ text, controller, want string }{
		{"4:memory:/a\n2:cpuacct:/b\n1:cpu:/c\n0::/d\n", "cpu", "/c"},
		{"3:cpu,cpuacct:/kubepods/pod1\n1:cpuset:/x\n", "cpu", "/kubepods/pod1"},
		{"0::/user.slice/session-1.scope\n", "", "/user.slice/session-1.scope"},
		{"5:memory:/a\n", "cpu", "/"},
	} {
		if got := cgroupPath(tc.text, tc.controller); got != tc.want {
			t.Errorf("cgroupPath(%q, %q) = %q, want %q", tc.text, tc.controller, got, tc.want)
		}
	}
}

// TestPodsRefusesBadFlags: its flags are checked before anything runs.
func TestPodsRefusesBadFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--scenario", "pods", "--pods-cpu", "0"}, "--pods-cpu 0"},
		{[]string{"--scenario", "pods", "--pods-work", "-1ms"}, "--pods-work -1ms"},
		{[]string{"--scenario", "pods", "--pods-hog", "-1"}, "--pods-hog -1"},
		{[]string{"--scenario", "pods", "--pods-procs", "5", "--pods-callers", "4"}, "--pods-procs 5"},
		{[]string{"--scenario", "pods", "--pods-rate", "0"}, "--pods-rate 0"},
		{[]string{"--scenario", "impatient", "--pods-cpu", "100"}, "--pods-cpu is a flag of the pods scenario"},
	} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), tc.args, &stdout, &stderr)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("run(%q) = %v, want an error containing %q", tc.args, err, tc.want)
		}
	}
}
