package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// TestChaosSoak runs a short chaos soak on a throwaway redis-server, with
// a fixed seed, and holds it to the soak's goal: no excess in any Redis
// epoch, no hang, no lost caller. Every fault kind happens once (the
// schedule deals each kind once per round).
func TestChaosSoak(t *testing.T) {
	if testing.Short() {
		t.Skip("the soak takes about 30 s")
	}
	redistest.New(t).RequireReal(t) // run starts its own; CI fails without redis-server
	var stdout, stderr bytes.Buffer
	args := []string{"chaos", "--duration", "25s", "--seed", "1", "--procs", "3", "--callers", "60",
		"--capacity", "10", "--refill-frequency", "5ms", "--json"}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := run(ctx, args, &stdout, &stderr); err != nil {
		t.Fatalf("run: %v\n%s", err, stderr.String())
	}
	rep := decode(t, stdout.Bytes())
	c := rep.Chaos
	if c == nil {
		t.Fatalf("no chaos section: %s", stdout.String())
	}
	var out bytes.Buffer
	tab := newTable(&out, "chaos")
	c.table(tab, rep.Limit)
	tab.Flush()
	t.Logf("%s", out.String())
	if !c.OK() {
		t.Errorf("chaos goal missed: excess slots %d, starts %d, early %d, hangs %d, lost %d (seed %d)",
			c.ExcessSlots, c.ExcessStart, c.Early, c.Hangs, c.Lost, c.Seed)
	}
	if c.Grants < 1000 {
		t.Errorf("%d grants in 25 s at 200/s, want ≥ 1000", c.Grants)
	}
	var kinds []string
	for _, f := range c.Faults {
		if !slices.Contains(kinds, f.Kind) {
			kinds = append(kinds, f.Kind)
		}
	}
	if len(kinds) < 8 {
		t.Errorf("fault kinds %q: want all 8", kinds)
	}
	if c.Restarts == 0 || len(c.Epochs) != c.Restarts+1 {
		t.Errorf("%d restarts, %d epochs", c.Restarts, len(c.Epochs))
	}
}

// TestScriptCommandsCoverLua reads every redis.call in queue/lua/*.lua and
// fails when one is missing from scriptCommands, whose rows the Redis CPU
// figure leaves out as already counted inside EVALSHA.
func TestScriptCommandsCoverLua(t *testing.T) {
	// The scripts and the code they share: the scheduler's LTRIM went
	// uncounted while only queue/lua was read.
	var files []string
	for _, dir := range []string{"../../queue/lua", "../../scheduler/lua", "../../internal/protocol", "../../internal/presence"} {
		fs, err := filepath.Glob(dir + "/*.lua")
		if err != nil || len(fs) == 0 {
			t.Fatalf("no Lua scripts found in %s: %v", dir, err)
		}
		files = append(files, fs...)
	}
	call := regexp.MustCompile(`redis\.(?:p?call)\(\s*['"]([A-Za-z]+)['"]`)
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range call.FindAllStringSubmatch(string(src), -1) {
			if cmd := strings.ToLower(m[1]); !slices.Contains(scriptCommands, cmd) {
				t.Errorf("%s calls %s, missing from scriptCommands", filepath.Base(f), strings.ToUpper(cmd))
			}
		}
	}
}

// TestRedisCPU: inner commands are not added to their script's time, and
// this command's INFO calls are left out.
func TestRedisCPU(t *testing.T) {
	before, err := parseCPU("# Commandstats\r\ncmdstat_evalsha:calls=10,usec=100,usec_per_call=10.00\r\n# CPU\r\nused_cpu_sys:1.0\r\nused_cpu_user:2.0\r\n")
	if err != nil {
		t.Fatal(err)
	}
	after, err := parseCPU("# Commandstats\r\ncmdstat_evalsha:calls=20,usec=1100,usec_per_call=55.00\r\n" +
		"cmdstat_get:calls=10,usec=50,usec_per_call=5.00\r\ncmdstat_info:calls=3,usec=90,usec_per_call=30\r\n" +
		"cmdstat_script|load:calls=1,usec=20,usec_per_call=20\r\n# CPU\r\nused_cpu_sys:1.5\r\nused_cpu_user:2.5\r\n")
	if err != nil {
		t.Fatal(err)
	}
	c := redisCPU(before, after, 10, false)
	if c.CommandsUsec != 1020 || c.ScriptsUsec != 1000 || c.PerGrant != 102*time.Microsecond {
		t.Errorf("commands %d µs, scripts %d µs, per grant %v; want 1020, 1000, 102µs", c.CommandsUsec, c.ScriptsUsec, c.PerGrant)
	}
	if c.ProcessCPU != time.Second || c.ProcessCPUPerGrant != 100*time.Millisecond {
		t.Errorf("process CPU %v, per grant %v; want 1s, 100ms", c.ProcessCPU, c.ProcessCPUPerGrant)
	}

	// Direct polls: 4 of the 10 TIME calls came with a GETDEL, outside scripts.
	direct, err := parseCPU("# Commandstats\r\ncmdstat_evalsha:calls=20,usec=1100,usec_per_call=55.00\r\n" +
		"cmdstat_time:calls=10,usec=50,usec_per_call=5.00\r\ncmdstat_getdel:calls=4,usec=8,usec_per_call=2.00\r\n" +
		"# CPU\r\nused_cpu_sys:1.5\r\nused_cpu_user:2.5\r\n")
	if err != nil {
		t.Fatal(err)
	}
	c = redisCPU(before, direct, 10, false)
	if want := int64(1000 + 20 + 8); c.CommandsUsec != want {
		t.Errorf("with direct polls: commands %d µs, want %d (scripts, 4 of 10 TIMEs, GETDELs)", c.CommandsUsec, want)
	}

	// The floor scripts (EVAL) are a unit of measure, not the bucket's cost.
	floor, err := parseCPU("# Commandstats\r\ncmdstat_evalsha:calls=20,usec=1100,usec_per_call=55.00\r\n" +
		"cmdstat_eval:calls=5,usec=100,usec_per_call=20.00\r\n# CPU\r\nused_cpu_sys:1.5\r\nused_cpu_user:2.5\r\n")
	if err != nil {
		t.Fatal(err)
	}
	c = redisCPU(before, floor, 10, false)
	if c.CommandsUsec != 1000 || c.FloorUsec != 20 || c.PerGrantFloors != 5 {
		t.Errorf("with floor scripts: commands %d µs, floor %.1f µs, %.2f floors per grant; want 1000, 20, 5", c.CommandsUsec, c.FloorUsec, c.PerGrantFloors)
	}
}

func TestMachineCPU(t *testing.T) {
	a, ok := parseCPULine("cpu  100 0 50 800 10 0 10 30 0 0")
	if !ok {
		t.Fatal("line not parsed")
	}
	b, _ := parseCPULine("cpu  160 0 70 900 10 0 10 50 0 0")
	m := machineCPU(a, b)
	// Δ busy 80 (user 60, system 20), Δ idle 100, Δ steal 20: total 200.
	if m == nil || m.Busy != 0.4 || m.Stolen != 0.1 {
		t.Fatalf("got %+v, want busy 0.4, stolen 0.1", m)
	}
	if _, ok := parseCPULine("cpu0 1 2 3 4 5 6 7 8"); ok {
		t.Error("a per-CPU line was taken for the aggregate")
	}
	if machineCPU(b, a) != nil {
		t.Error("a backwards interval gave a figure")
	}
}
