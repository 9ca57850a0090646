package main

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/bucket"
)

// Report is everything one run measured: where, on what, and each
// scenario's figures under its name.
type Report struct {
	Machine   Machine
	Redis     RedisInfo
	Limit     Limit
	Scenarios []scenario // in the order they ran
	// Skipped are the scenarios picked that did not run on miniredis
	// (about.needs), in the order they would have run.
	Skipped []Skipped
}

// Skipped is a scenario that did not run, and why.
type Skipped struct {
	Scenario string `json:"scenario"`
	Why      string `json:"why"`
}

// MarshalJSON writes the report as one object: "machine", "redis",
// "limit", then each scenario under its key, and "skipped" when some
// were.
func (r Report) MarshalJSON() ([]byte, error) {
	m := map[string]any{"machine": r.Machine, "redis": r.Redis, "limit": r.Limit}
	for _, s := range r.Scenarios {
		m[s.about().key()] = s
	}
	if len(r.Skipped) > 0 {
		m["skipped"] = r.Skipped
	}
	return json.Marshal(m)
}

// Machine is where the run happened.
type Machine struct {
	OS         string    `json:"os"`
	Arch       string    `json:"arch"`
	CPUs       int       `json:"cpus"`
	GOMAXPROCS int       `json:"gomaxprocs"`
	Go         string    `json:"go"`
	Host       string    `json:"host"`
	Time       time.Time `json:"time"`
}

// RedisInfo is the server the run used.
type RedisInfo struct {
	Server  string `json:"server"`
	Version string `json:"version"`
	// Fake is true for the in-process miniredis fallback: figures are not
	// representative.
	Fake bool `json:"fake"`
}

// Limit is the saturated bucket's configuration.
type Limit struct {
	Capacity        int           `json:"capacity"`
	RefillAmount    int           `json:"refill_amount"`
	RefillFrequency time.Duration `json:"refill_frequency_ns"`
	PerSecond       float64       `json:"per_second"`
}

// limitOf is the Limit of a bucket's Config.
func limitOf(c bucket.Config) Limit {
	return Limit{Capacity: c.Capacity, RefillAmount: c.RefillAmount, RefillFrequency: c.RefillFrequency,
		PerSecond: float64(c.RefillAmount) / c.RefillFrequency.Seconds()}
}

func writeJSON(w io.Writer, r Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// writeTable writes the report for people: where it ran, then one table
// per scenario.
func writeTable(w io.Writer, r Report) error {
	m := r.Machine
	if r.Redis.Fake {
		fmt.Fprintln(w, "!!! IN-PROCESS MINIREDIS, NOT redis-server: THESE FIGURES ARE NOT REPRESENTATIVE !!!")
	}
	fmt.Fprintf(w, "machine: %s/%s, %d CPUs (GOMAXPROCS %d), %s, %s\n", m.OS, m.Arch, m.CPUs, m.GOMAXPROCS, m.Go, m.Time.Format(time.RFC3339))
	fmt.Fprintf(w, "redis:   %s, %s\n", r.Redis.Version, r.Redis.Server)
	for _, s := range r.Skipped {
		fmt.Fprintf(w, "\n%s: skipped on miniredis: %s\n", strings.ToUpper(strings.ReplaceAll(s.Scenario, "-", " ")), s.Why)
	}
	for _, s := range r.Scenarios {
		t := newTable(w, s.about().name)
		s.table(t, r.Limit)
		if err := t.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// missedGoals names the goals the report says were not met, in the order
// it shows them: those of each scenario's table, drawn without being
// shown, so that they are the same whatever the output format.
func missedGoals(r Report) []string {
	var missed []string
	for _, s := range r.Scenarios {
		t := newTable(io.Discard, s.about().name)
		s.table(t, r.Limit)
		t.miss("") // a goal not followed by a row
		missed = append(missed, t.missed...)
	}
	return missed
}

// writeGobench writes the figures as Go benchmark results, for benchstat.
func writeGobench(w io.Writer, r Report) error {
	var g gobench
	fmt.Fprintf(&g, "goos: %s\ngoarch: %s\npkg: github.com/sluicehq/sluice/cmd/bench\n", r.Machine.OS, r.Machine.Arch)
	fmt.Fprintf(&g, "redis: %s\n", r.Redis.Version)
	if r.Redis.Fake {
		fmt.Fprintf(&g, "redis-server: miniredis-not-representative\n")
	}
	for _, s := range r.Scenarios {
		s.gobench(&g)
	}
	_, err := io.WriteString(w, g.String())
	return err
}

func f(x float64) string { return strconv.FormatFloat(x, 'g', 6, 64) }

func ms(d time.Duration) string { return f(float64(d) / float64(time.Millisecond)) }

func pct(a, b int) string { return fmt.Sprintf("%.2f %%", 100*per(int64(a), b)) }

// dur formats a duration with three significant digits and a unit.
func dur(d time.Duration) string {
	if d == 0 {
		return "0"
	}
	// Three significant figures in the smallest unit that keeps them
	// below 1,000: 999.7 µs is "1 ms", not "1e+03 µs".
	for _, u := range []struct {
		size time.Duration
		name string
	}{{time.Microsecond, "µs"}, {time.Millisecond, "ms"}} {
		v := float64(d) / float64(u.size)
		if s := strconv.FormatFloat(v, 'g', 3, 64); !strings.Contains(s, "e") && math.Abs(v) < 999.5 {
			return s + " " + u.name
		}
	}
	return fmt.Sprintf("%.3g s", d.Seconds())
}

// num formats a rate: no decimals from 100 up.
func num(x float64) string {
	if x >= 100 {
		return commas(int(x + 0.5))
	}
	return strconv.FormatFloat(x, 'f', 2, 64)
}

// commas writes n with thousands separators.
func commas(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// vsLimit says how the most grants in any window compare with what the
// limit allows there (an excess: ≤ 0 means the limit held).
func vsLimit(excess int) string {
	switch {
	case excess < 0:
		return commas(-excess) + " below the limit"
	case excess == 0:
		return "exactly the limit"
	}
	return commas(excess) + " OVER the limit"
}

// windows describes the busiest window of e, and the busiest of those at
// most 1 s and 100 ms long.
func windows(e Excess) string {
	short := func(p *int) string {
		if p == nil {
			return "not computed (too many grants)"
		}
		return vsLimit(*p)
	}
	return fmt.Sprintf("the busiest held %s grants in %s; of windows up to 1 s long: %s, up to 100 ms: %s", commas(e.Count), dur(e.Span), short(e.Sec), short(e.Tenth))
}

func ns(d time.Duration) int64 { return int64(d) }

// usec formats a count of µs as a duration.
func usec(x float64) string { return dur(time.Duration(x * float64(time.Microsecond))) }
