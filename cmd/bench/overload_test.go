package main

import (
	"bytes"
	"context"
	"encoding/json"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// TestOverloadScenario runs a short overload run in two worker processes,
// each with its busy goroutines, and checks what must hold on any
// machine: callers were granted without errors, the limit held for every
// grant, and the table has its rows and goals. Utilization is the
// bench's to judge, not this test's.
func TestOverloadScenario(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	var stdout, stderr bytes.Buffer
	args := []string{"--redis", srv.URL(), "--scenario", "overload", "--overload-duration", "1s",
		"--overload-callers", "40", "--overload-procs", "2", "--capacity", "10", "--refill-frequency", "5ms", "--json"}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute) // a bound on a hang, not a speed goal
	defer cancel()
	if err := run(ctx, args, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	var rep struct {
		Overload *Overload `json:"overload"`
	}
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil || rep.Overload == nil {
		t.Fatalf("no overload figures (%v): %s", err, stdout.String())
	}
	o := rep.Overload
	if o.Hog != 2*runtime.NumCPU() {
		t.Errorf("%d busy goroutines a process, want 2 a CPU (%d)", o.Hog, 2*runtime.NumCPU())
	}
	if o.Grants < 10 || o.Errors != 0 {
		t.Errorf("%d grants, %d errors (%s)", o.Grants, o.Errors, o.Err)
	}
	if !o.NoExcess() {
		t.Errorf("over the limit: by slot %d, by start %d", o.ExcessSlots.All, o.ExcessStartsSlack)
	}

	var table bytes.Buffer
	tw := newTable(&table, "overload")
	o.table(tw, Limit{Capacity: 10, RefillAmount: 1, RefillFrequency: 5 * time.Millisecond, PerSecond: 200})
	tw.Flush()
	for _, w := range []string{"OVERLOAD", "busy goroutines", "utilization", "goal ≥ 90 %", "excess over the limit", "goal 0", "re-entries", "retimes", "started at once"} {
		if !strings.Contains(table.String(), w) {
			t.Errorf("table lacks %q:\n%s", w, table.String())
		}
	}
}
