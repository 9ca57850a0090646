package main

import (
	"bytes"
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// TestMiniredisFallback runs scenarios of the default list, shortened, as
// `go run ./cmd/bench` runs them on a machine without redis-server: on an
// in-process miniredis (whose TCP listener the worker processes reach),
// with the loud warning; each scenario that can run there runs, each one
// that needs a real server says it skips and why, and the run succeeds
// (main exits 0). The figures are not judged: on miniredis they are not
// representative. The scenarios picked are those that skip and one of
// each kind that runs: callers in worker processes (saturate), the
// semaphore's processes, costs of several policies (quota), callers that
// give up (impatient), short-lived processes (churn), lanes (whose cost
// case alone says it cannot run there). Overhead and
// compare, whose work is fixed, take a minute each on miniredis under
// -race; they run in the bench, not here.
func TestMiniredisFallback(t *testing.T) {
	start := startServer
	startServer = func() (*redistest.Server, error) { return nil, redistest.ErrNoRedisServer }
	t.Cleanup(func() { startServer = start })

	picked := []string{"scripts", "saturate", "semaphore", "quota", "policy-change", "tenants", "lanes", "impatient", "churn"}
	args := []string{"--scenario", strings.Join(picked, ","), "--duration", "500ms", "--callers", "20", "--procs", "2",
		"--quota-duration", "500ms", "--quota-callers", "20", "--quota-procs", "1",
		"--change-phase", "300ms", "--change-callers", "20", "--change-procs", "1",
		"--tenants-buckets", "20", "--tenants-semaphores", "2", "--tenants-callers", "2", "--tenants-idle", "200ms",
		"--impatient-duration", "500ms", "--impatient-callers", "20", "--impatient-procs", "1",
		"--churn-duration", "500ms", "--churn-cases", "calm-exit",
		"--lanes-duration", "500ms", "--lanes-procs", "2", "--lanes-tenants", "100"}
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // a bound on a hang, not a speed goal
	defer cancel()
	if err := run(ctx, args, &stdout, &stderr); err != nil {
		t.Fatalf("run on miniredis: %v (main would exit 1)\n%s", err, stderr.String())
	}
	out, log := stdout.String(), stderr.String()
	for _, w := range []string{"redis-server is not on PATH: using in-process miniredis", "THE FIGURES ARE NOT REPRESENTATIVE"} {
		if !strings.Contains(log, w) {
			t.Errorf("stderr lacks the warning %q:\n%s", w, log)
		}
	}
	if !strings.HasPrefix(out, "!!! IN-PROCESS MINIREDIS, NOT redis-server") {
		t.Errorf("the report does not start with the warning:\n%s", out)
	}
	var needs []string
	for _, s := range scenarios() {
		a := s.about()
		if a.all && a.needs != "" {
			needs = append(needs, a.name)
		}
		if !slices.Contains(picked, a.name) {
			continue
		}
		title := strings.ToUpper(strings.ReplaceAll(a.name, "-", " "))
		if a.needs == "" {
			if !strings.Contains(out, "\n"+title) || strings.Contains(out, title+": skipped") {
				t.Errorf("%s did not run on miniredis:\n%s", a.name, out)
			}
			continue
		}
		if !strings.Contains(out, "\n"+title+": skipped on miniredis: "+a.needs+"\n") || !strings.Contains(log, a.name+": skipped on miniredis: "+a.needs+"\n") {
			t.Errorf("%s needs redis-server, yet the report or stderr does not say it skipped and why (%s):\n%s\n%s", a.name, a.needs, out, log)
		}
	}
	// Of the default list, only these cannot run on miniredis.
	if want := []string{"scripts", "policy-change", "tenants"}; !slices.Equal(needs, want) {
		t.Errorf("the default scenarios that skip on miniredis: %q; want %q (the others run there)", needs, want)
	}
}
