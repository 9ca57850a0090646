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

// TestSidecarScenario runs a short sidecar run and checks what must hold
// on any machine: both kinds of callers were granted without errors, the
// limit held over every grant of both, each server grant carried its slot,
// and the table has its rows and goals. Utilization, order and the
// uncontended ratio are the bench's to judge, not this test's.
func TestSidecarScenario(t *testing.T) {
	srv := redistest.New(t)
	var stdout, stderr bytes.Buffer
	args := []string{"--redis", srv.URL(), "--scenario", "sidecar", "--sidecar-duration", "500ms",
		"--sidecar-callers", "20", "--sidecar-uncontended", "50", "--capacity", "10", "--refill-frequency", "5ms", "--json"}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // a bound on a hang (and a first build), not a speed goal
	defer cancel()
	if err := run(ctx, args, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	var rep struct {
		Sidecar *Sidecar `json:"sidecar"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil || rep.Sidecar == nil {
		t.Fatalf("no sidecar figures (%v): %s", err, stdout.String())
	}
	s := rep.Sidecar
	if s.Errors != 0 || s.LibraryGrants < 10 || s.SidecarGrants < 10 {
		t.Errorf("%d grants through the library, %d through the server, %d errors (%s)", s.LibraryGrants, s.SidecarGrants, s.Errors, s.Err)
	}
	if s.ExcessSlots.All > 0 {
		t.Errorf("over the limit by grant time: %d", s.ExcessSlots.All)
	}
	if s.EnterLibrary.N != 50 || s.EnterSidecar.N != 50 || s.EnterSidecar.P50 <= 0 || s.HTTPAlone.N != 50 {
		t.Errorf("uncontended: library %+v, server %+v; want 50 each", s.EnterLibrary, s.EnterSidecar)
	}

	var table bytes.Buffer
	tw := newTable(&table, "sidecar")
	s.table(tw, Limit{Capacity: 10, RefillAmount: 1, RefillFrequency: 5 * time.Millisecond, PerSecond: 200})
	tw.Flush()
	for _, w := range []string{"SIDECAR", "utilization", "goal ≥ 99 %", "excess over the limit", "grants overtaken, by grant time", "goal ≤ 0.5 %", "uncontended enter, p50 ratio", "goal ≤ 2×", "through the server", "an HTTP request alone"} {
		if !strings.Contains(table.String(), w) {
			t.Errorf("table lacks %q:\n%s", w, table.String())
		}
	}
}
