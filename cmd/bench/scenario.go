package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/sluicehq/sluice/bucket"
)

// A scenario is one part of the benchmark. Its value holds both its flags
// and, once run, its figures: the report's JSON is the exported fields,
// its table and benchstat lines are the scenario's own. Adding a scenario
// is one file that implements scenario, and a line in scenarios.
type scenario interface {
	about() about
	// flags registers the scenario's own flags; check validates them
	// before anything runs.
	flags(fs *flag.FlagSet)
	check() error
	run(ctx context.Context, e *env) error
	// table writes the scenario's rows for people; gobench its lines in
	// the Go benchmark format.
	table(t *table, l Limit)
	gobench(g *gobench)
}

// about describes a scenario for --help.
type about struct {
	name  string // what --scenario calls it
	what  string // what it measures, in a line
	takes string // roughly how long it runs with the default flags
	all   bool   // part of --scenario all
	// needs says why the scenario cannot run on the in-process miniredis
	// (the fallback without redis-server), which it then skips, saying
	// so: a server it must kill or read the costs of, or figures that
	// would mean nothing there. "" means it runs on miniredis too.
	needs string
}

// key is the scenario's key in the JSON report: its name, with _ for -
// ("policy-change" is "policy_change").
func (a about) key() string { return strings.ReplaceAll(a.name, "-", "_") }

// scenarios returns one of each scenario, in the order they run.
func scenarios() []scenario {
	return []scenario{&Overhead{}, &Scripts{}, &Saturate{}, &Semaphore{}, &Compare{}, &Scale{}, &Quota{}, &PolicyChange{}, &Upstream{}, &LLM{}, &Tenants{}, &Lanes{}, &Overload{}, &Impatient{}, &Pods{}, &Churn{}, &Outage{}, &Sidecar{}}
}

// env is what every scenario runs with.
type env struct {
	target
	limit bucket.Config // --capacity, --refill-amount, --refill-frequency
	name  string        // unique to this run and scenario: prefix the bucket names with it
	log   io.Writer     // progress, for the person waiting
}

func (e *env) logf(format string, a ...any) { fmt.Fprintf(e.log, format+"\n", a...) }

// table is one scenario's section of the report for people: a title line,
// then aligned rows. It records the goals its rows say were not met, so
// that --check judges the very goals the report shows.
type table struct {
	*tabwriter.Writer
	scenario string   // what --scenario calls it: the first word of a missed goal's name
	section  string   // the last row not indented: the group of the rows under it
	pending  []string // goals not met written since the last row, by what they want
	missed   []string // goals not met, each named by its scenario and row
}

func newTable(w io.Writer, scenario string) *table {
	return &table{Writer: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0), scenario: scenario}
}

func (t *table) title(format string, a ...any) { fmt.Fprintf(t, "\n"+format+"\n", a...) }

// row writes one indented row of cells; the last is not padded. The goals
// its cells say were not met are named after its first cell (after the
// row it is indented under, if any).
func (t *table) row(cells ...string) {
	fmt.Fprintf(t, "  %s\n", strings.Join(cells, "\t"))
	label := ""
	if len(cells) > 0 {
		label = cells[0]
	}
	name := strings.TrimSpace(label)
	switch {
	case strings.HasPrefix(label, " ") && t.section != "":
		name = t.section + " " + name
	case label != "":
		t.section = name
	}
	t.miss(name)
}

// miss records the pending goals not met under name: by name alone when
// the row had one goal, else with what each wanted.
func (t *table) miss(name string) {
	name = strings.TrimSpace(t.scenario + " " + name)
	for _, want := range t.pending {
		if len(t.pending) > 1 {
			t.missed = append(t.missed, name+" ("+want+")")
		} else {
			t.missed = append(t.missed, name)
		}
	}
	t.pending = nil
}

// goal says in words whether a figure met its goal ("goal ≥ 90 %: met"),
// and records a goal not met under the row it is written in.
func (t *table) goal(met bool, want string) string {
	if met {
		return "goal " + want + ": met"
	}
	t.pending = append(t.pending, want)
	return "goal " + want + ": NOT MET"
}

// dist writes a row of a distribution: p50, p99, max.
func (t *table) dist(name string, d Dist, note string) {
	t.row(name, dur(d.P50), dur(d.P99), dur(d.Max), note)
}

// gobench gathers lines in the Go benchmark format, for benchstat.
type gobench struct{ strings.Builder }

// line writes one benchmark: its name, its count n, then value-unit pairs.
func (g *gobench) line(name string, n int, metrics ...any) {
	fmt.Fprintf(g, "Benchmark%s %d", name, max(n, 1))
	for i := 0; i+1 < len(metrics); i += 2 {
		fmt.Fprintf(g, " %v %s", metrics[i], metrics[i+1])
	}
	g.WriteByte('\n')
}
