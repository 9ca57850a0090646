package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
)

// Compare is the same workloads run against each contender, in one run.
type Compare struct {
	Limit    Limit           `json:"limit"` // of the saturated workload
	Callers  int             `json:"callers"`
	Duration time.Duration   `json:"duration_ns"`
	Results  []CompareResult `json:"results"` // Sluice first
}

// CompareResult is one contender's figures.
type CompareResult struct {
	Name string `json:"name"`
	Key  string `json:"key"`
	// Uncontended is sequential calls with the limit far above reach.
	Uncontended Dist `json:"uncontended"`
	// Admit is N concurrent callers released at once with the limit far
	// above reach: time until the last returns, per round.
	Admit []Admit `json:"admit"`
	// Hammer is hammerCallers looping with the limit far above reach.
	Hammer Hammer `json:"hammer"`
	// Saturated is Callers looping on the saturated limit for Duration.
	Saturated CompareSaturation `json:"saturated"`
}

// CompareSaturation judges a saturated run from what every contender
// shows: when each call began and when it returned.
type CompareSaturation struct {
	Grants int    `json:"grants"`
	Errors int    `json:"errors"`
	Err    string `json:"first_error,omitempty"`
	// CutOff counts calls still waiting when the run was stopped
	// (Duration + compareTail): the longest waits, not in Wait.
	CutOff     int        `json:"cut_off"`
	Throughput Throughput `json:"throughput"` // on return times
	// Excess is the worst window of the return times against the
	// guarantee; ExcessSlack the same with windows startSlack +
	// defaultMaxLateness longer (Sluice's promise for start times).
	Excess      Excess `json:"excess"`
	ExcessSlack int    `json:"excess_slack"`
	// Wait is the duration of the calls begun after the warm-up
	// (callers / rate); MaxOverMedian is Wait.Max / Wait.P50.
	Warmup        time.Duration `json:"warmup_ns"`
	Wait          Dist          `json:"wait_steady"`
	MaxOverMedian float64       `json:"wait_max_over_median"`
	// Overtaken counts grants that a call begun more than overtakeTol
	// later beat by more than overtakeTol.
	Overtaken int `json:"overtaken"`
	// RoundTrips is what a go-redis hook counted during the run.
	RoundTrips int64 `json:"round_trips"`
}

// RoundTripsPerGrant is RoundTrips per grant.
func (s CompareSaturation) RoundTripsPerGrant() float64 { return per(s.RoundTrips, s.Grants) }

const (
	compareSamples = 1000
	compareRounds  = 3
	compareHammer  = time.Second
	// compareTail is how long after Duration calls still waiting are
	// given before the run is cut off (redis_rate's herd can starve some).
	compareTail = 3 * time.Second
	overtakeTol = time.Millisecond
)

func (*Compare) about() about {
	return about{name: "compare", takes: "~20 s", all: true,
		what: "the same workloads against x/time/rate, a one-script GCRA limiter and go-redis/redis_rate, with ratios to Sluice"}
}

func (c *Compare) flags(fs *flag.FlagSet) {
	fs.IntVar(&c.Callers, "compare-callers", 200, "callers looping on the saturated limit (one process)")
	fs.DurationVar(&c.Duration, "compare-duration", 3*time.Second, "length of each contender's saturated run")
}

func (c *Compare) check() error {
	switch {
	case c.Callers < 1:
		return fmt.Errorf("--compare-callers %d: want ≥ 1", c.Callers)
	case c.Duration <= 0:
		return fmt.Errorf("--compare-duration %v: want > 0", c.Duration)
	}
	return nil
}

// run runs every contender through the same workloads, one after the
// other, each on its own client.
func (c *Compare) run(ctx context.Context, e *env) error {
	sat := rateLimit{Burst: e.limit.Capacity, Amount: e.limit.RefillAmount, Every: e.limit.RefillFrequency}
	c.Limit = limitOf(e.limit)
	for i, k := range contenders {
		e.logf("compare: %s: uncontended, 100 and 1,000 at once, %d looping, %d callers saturating %s/s for %v...",
			k.Name, hammerCallers, c.Callers, num(c.Limit.PerSecond), c.Duration)
		r, err := compareOne(ctx, e.opt, fmt.Sprintf("%s-%d", e.name, i), k, sat, c.Callers, c.Duration)
		if err != nil {
			return fmt.Errorf("%s: %w", k.Name, err)
		}
		c.Results = append(c.Results, r)
	}
	return nil
}

// table writes the contenders side by side, each figure with its ratio to
// Sluice's.
func (c *Compare) table(t *table, _ Limit) {
	l := c.Limit
	t.title("COMPARE: the same workloads in this run, one process each; (×) is the ratio to sluice; saturated: %d callers loop for %v on capacity %d, %d every %v = %s/s",
		c.Callers, c.Duration, l.Capacity, l.RefillAmount, l.RefillFrequency, num(l.PerSecond))
	res := c.Results
	if len(res) == 0 {
		return
	}
	header := []string{""}
	for _, r := range res {
		header = append(header, r.Name)
	}
	t.row(header...)
	// cells writes one row: v(r) formatted by format, with the ratio to
	// the first (Sluice) when ratio is set.
	cells := func(name string, v func(CompareResult) float64, format func(float64) string, ratio bool) {
		out := []string{name}
		base := v(res[0])
		for i, r := range res {
			x := v(r)
			cell := format(x)
			switch {
			case ratio && i > 0 && base != 0:
				cell += fmt.Sprintf(" (%s×)", ratioString(x/base))
			case ratio && i > 0:
				cell += " (—)"
			}
			out = append(out, cell)
		}
		t.row(out...)
	}
	d := func(x float64) string { return dur(time.Duration(x)) }
	f3 := func(x float64) string { return fmt.Sprintf("%.3f", x) }
	n := func(x float64) string { return commas(int(x)) }
	vs := func(x float64) string { return vsLimit(int(x)) }
	cells("uncontended call, p50", func(r CompareResult) float64 { return float64(r.Uncontended.P50) }, d, true)
	cells("uncontended call, p99", func(r CompareResult) float64 { return float64(r.Uncontended.P99) }, d, true)
	for i, a := range res[0].Admit {
		cells(fmt.Sprintf("%s at once: last returns, median", commas(a.Callers)), func(r CompareResult) float64 { return float64(r.Admit[i].Last.P50) }, d, true)
	}
	h := res[0].Hammer
	cells(fmt.Sprintf("grants/s, %d callers, no limit in reach", h.Callers), func(r CompareResult) float64 { return r.Hammer.PerSecond }, func(x float64) string { return commas(int(x + 0.5)) }, true)
	cells("  round trips per grant", func(r CompareResult) float64 { return r.Hammer.RoundTripsPerGrant }, f3, true)
	cells("saturated: grants", func(r CompareResult) float64 { return float64(r.Saturated.Grants) }, n, false)
	cells("  utilization", func(r CompareResult) float64 { return r.Saturated.Throughput.Utilization }, func(x float64) string { return fmt.Sprintf("%.2f %%", 100*x) }, true)
	cells("  busiest window, by return", func(r CompareResult) float64 { return float64(r.Saturated.Excess.All) }, vs, false)
	cells(fmt.Sprintf("  the same, windows %s longer", dur(bucketSlack())), func(r CompareResult) float64 { return float64(r.Saturated.ExcessSlack) }, vs, false)
	cells("  wait p50 (steady)", func(r CompareResult) float64 { return float64(r.Saturated.Wait.P50) }, d, true)
	cells("  wait max (steady)", func(r CompareResult) float64 { return float64(r.Saturated.Wait.Max) }, d, true)
	cells("  wait max / median", func(r CompareResult) float64 { return r.Saturated.MaxOverMedian }, f3, true)
	cells("  overtaken (by a later call)", func(r CompareResult) float64 { return 100 * per(int64(r.Saturated.Overtaken), r.Saturated.Grants) }, func(x float64) string { return fmt.Sprintf("%.2f %%", x) }, false)
	cells("  round trips per grant", func(r CompareResult) float64 { return r.Saturated.RoundTripsPerGrant() }, f3, true)
	cells("  cut off at the end", func(r CompareResult) float64 { return float64(r.Saturated.CutOff) }, n, false)
	cells("  errors", func(r CompareResult) float64 { return float64(r.Saturated.Errors) }, n, false)
	t.Flush()
	fmt.Fprintf(t, "  busiest window: the most grants in any window against what the limit allows there (\"1 OVER the limit\": one more);\n"+
		"  by return, a grant counts when its call returned; windows %s longer allow Sluice's MaxLateness and the reply's trip\n", dur(bucketSlack()))
}

func (c *Compare) gobench(g *gobench) {
	for _, x := range c.Results {
		name := "Compare/" + x.Key
		g.line(name+"/uncontended", x.Uncontended.N, ns(x.Uncontended.P50), "ns/op", ns(x.Uncontended.P99), "p99-ns/op")
		for _, a := range x.Admit {
			g.line(fmt.Sprintf("%s/admit-%d", name, a.Callers), a.Rounds, ns(a.Last.P50), "ns/burst", ns(a.Last.Max), "max-ns/burst")
		}
		h := x.Hammer
		g.line(fmt.Sprintf("%s/hammer-%d", name, h.Callers), h.Grants, f(h.PerSecond), "grants/s", f(h.RoundTripsPerGrant), "round-trips/op")
		s := x.Saturated
		g.line(name+"/saturated", s.Grants, f(s.Throughput.Utilization), "utilization", s.Excess.All, "excess", s.ExcessSlack, "excess-slack",
			ms(s.Wait.P50), "ms-wait-p50", ms(s.Wait.Max), "ms-wait-max", f(s.MaxOverMedian), "max/median",
			f(100*per(int64(s.Overtaken), s.Grants)), "pct-overtaken", f(s.RoundTripsPerGrant()), "round-trips/op", s.CutOff, "cut-off", s.Errors, "errors")
	}
}

// bucketSlack is how much longer the slack windows are: Sluice's
// MaxLateness default and the reply's trip.
func bucketSlack() time.Duration { return defaultMaxLateness + startSlack }

// ratioString formats a ratio with two or three significant digits.
func ratioString(x float64) string {
	switch {
	case x >= 100:
		return fmt.Sprintf("%.0f", x)
	case x >= 10:
		return fmt.Sprintf("%.1f", x)
	case x >= 0.01:
		return fmt.Sprintf("%.2f", x)
	}
	return fmt.Sprintf("%.2g", x)
}

func compareOne(ctx context.Context, opt *redis.Options, name string, k contender, sat rateLimit, callers int, d time.Duration) (CompareResult, error) {
	r := CompareResult{Name: k.Name, Key: k.Key}
	rdb, rt, err := dialed(ctx, opt, max(1000, callers), k.Redis)
	if err != nil {
		return r, err
	}
	defer rdb.Close()

	l, err := k.New(rdb, name+"-seq", farAbove)
	if err != nil {
		return r, err
	}
	r.Uncontended, err = timeCalls(compareSamples, func() error { return l.Wait(ctx) })
	l.Close()
	if err != nil {
		return r, fmt.Errorf("uncontended: %w", err)
	}
	if r.Admit, r.Hammer, err = burstsAndHammer(ctx, rdb, rt, name, k, compareRounds, compareHammer); err != nil {
		return r, err
	}
	r.Saturated, err = compareSaturate(ctx, rdb, rt, name+"-sat", k, sat, callers, d)
	return r, err
}

// call is one Wait of the saturated workload.
type call struct {
	start, end time.Time
	err        error
}

// compareSaturate has callers loop Wait on one limiter at the saturated
// limit; they begin no call after d, and calls still waiting at d +
// compareTail are cut off.
func compareSaturate(ctx context.Context, rdb *redis.Client, rt *loadgen.RoundTripCounter, name string, k contender, sat rateLimit, callers int, d time.Duration) (CompareSaturation, error) {
	l, err := k.New(rdb, name, sat)
	if err != nil {
		return CompareSaturation{}, err
	}
	defer l.Close()
	runCtx, cancel := context.WithTimeout(ctx, d+compareTail)
	defer cancel()
	calls := make([][]call, callers)
	before := rt.RoundTrips()
	start := time.Now()
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			for runCtx.Err() == nil && time.Since(start) < d {
				t := time.Now()
				err := l.Wait(runCtx)
				calls[i] = append(calls[i], call{t, time.Now(), err})
			}
		})
	}
	wg.Wait()
	trips := rt.RoundTrips() - before
	if err := ctx.Err(); err != nil {
		return CompareSaturation{}, err
	}
	lim := guarantee.Limit{Capacity: sat.Burst, RefillAmount: sat.Amount, RefillFrequency: sat.Every}
	perSec := float64(sat.Amount) / sat.Every.Seconds()
	warmup := min(time.Duration(float64(callers)/perSec*float64(time.Second)), d/2)
	s := judgeCalls(slices.Concat(calls...), lim, warmup)
	s.RoundTrips = trips
	return s, nil
}

// judgeCalls analyses the calls of a saturated run: calls cut off by the
// run's end (context errors) are counted apart from errors.
func judgeCalls(calls []call, l guarantee.Limit, warmup time.Duration) CompareSaturation {
	s := CompareSaturation{Warmup: warmup}
	var begin time.Time
	for i, c := range calls {
		if i == 0 || c.start.Before(begin) {
			begin = c.start
		}
	}
	var starts, ends []time.Time
	var waits []time.Duration
	for _, c := range calls {
		switch {
		case errors.Is(c.err, context.DeadlineExceeded) || errors.Is(c.err, context.Canceled):
			s.CutOff++
			continue
		case c.err != nil:
			s.Errors++
			if s.Err == "" {
				s.Err = c.err.Error()
			}
			continue
		}
		s.Grants++
		starts = append(starts, c.start)
		ends = append(ends, c.end)
		if c.start.Sub(begin) >= warmup {
			waits = append(waits, c.end.Sub(c.start))
		}
	}
	s.Throughput = throughput(ends, l)
	s.Excess = excessOf(ends, l)
	s.ExcessSlack = guarantee.CheckSlack(ends, l, defaultMaxLateness+startSlack).Excess
	s.Wait = distOf(waits)
	if s.Wait.P50 > 0 {
		s.MaxOverMedian = float64(s.Wait.Max) / float64(s.Wait.P50)
	}
	s.Overtaken = overtakenByStart(starts, ends, overtakeTol)
	return s
}

// overtakenByStart counts the calls i for which some call j began more
// than tol after i began and returned more than tol before i returned:
// a later caller served first. starts and ends are parallel.
func overtakenByStart(starts, ends []time.Time, tol time.Duration) int {
	idx := make([]int, len(starts))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return starts[a].Compare(starts[b]) })
	// Walk from the latest start back; j moves over the calls begun more
	// than tol after the current one, keeping their earliest return.
	n := 0
	j := len(idx)
	var earliest time.Time
	seen := false
	for k := len(idx) - 1; k >= 0; k-- {
		i := idx[k]
		for j > 0 && starts[idx[j-1]].Sub(starts[i]) > tol {
			j--
			if e := ends[idx[j]]; !seen || e.Before(earliest) {
				earliest, seen = e, true
			}
		}
		if seen && ends[i].Sub(earliest) > tol {
			n++
		}
	}
	return n
}
