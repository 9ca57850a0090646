package main

import (
	"context"
	"flag"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
)

// Lanes is one quota shared by lanes of callers (bucket.WithLane) in
// several processes: does each lane get its weight's share, and the
// others a stopped lane's at once; does a priority lane get through a
// saturating batch at once; does the scheduler's step cost more with
// thousands of lanes than with one? Every grant is judged against the
// limit.
type Lanes struct {
	Procs    int           `json:"procs"`
	Duration time.Duration `json:"duration_ns"` // each case's measured window
	Tenants  int           `json:"tenants"`
	Fair     *LanesFair    `json:"fair,omitempty"`
	Priority *LanesPrio    `json:"priority,omitempty"`
	Cost     *LanesCost    `json:"cost,omitempty"`

	cases string // --lanes-cases
}

// LanesFair is the fair-share case: lanes A, B and C (weight 2) loop on
// Enter; C's callers are cancelled after the measured window.
type LanesFair struct {
	Lanes []LaneShare `json:"lanes"`
	// Utilization is all lanes' grants in the window over what the limit
	// allows in it.
	Utilization float64 `json:"utilization"`
	// Takeover is from the stopped lane's last grant to the start of the
	// first lanesWindow in which the other lanes were granted ≥ 95 % of
	// the limit; -1 when there was none before the run ended.
	Takeover time.Duration `json:"takeover_ns"`
	lanesRun
}

// LaneShare is one lane's grants a second in the measured window, and
// what it is due: min(its demand, its weight's share), its weight's
// share since its callers loop (they would take the whole limit).
type LaneShare struct {
	Lane    string  `json:"lane"`
	Weight  int     `json:"weight"`
	Callers int     `json:"callers"`
	Rate    float64 `json:"rate_per_s"`
	Due     float64 `json:"due_per_s"`
	// Late counts its grants in the window whose caller came late for its
	// first slot (retimed) or took one another did not come for (claimed).
	Late int `json:"late"`
}

// LanesPrio is the priority case: a batch lane saturating the bucket, and
// calls of an interactive lane of a higher priority, each its own
// goroutine, at a steady pace.
type LanesPrio struct {
	Calls int  `json:"interactive_calls"`
	Wait  Dist `json:"interactive_wait"` // the granted calls' Enter, by this machine's clock
	// RTT is the median PING round trip, for the wait's goal.
	RTT         time.Duration `json:"rtt_ns"`
	Batch       float64       `json:"batch_rate_per_s"` // in the window
	Utilization float64       `json:"utilization"`
	lanesRun
}

// lanesRun is what every run reports: errors, and the excess of the
// busiest window of grant times over the limit (≤ 0: it held).
type lanesRun struct {
	Grants int    `json:"grants_all"`
	Excess int    `json:"excess"`
	Errors int    `json:"errors"`
	Err    string `json:"first_error,omitempty"`
}

// The quota of every case: 200/s, burst 20.
var lanesLimit = guarantee.Limit{Capacity: 20, RefillAmount: 1, RefillFrequency: 5 * time.Millisecond}

const (
	lanesStartup   = time.Second            // for the workers to start before the callers begin
	lanesWarmup    = 500 * time.Millisecond // before the measured window
	lanesCutAfter  = 50 * time.Millisecond  // the fair case's last lane stops this long after the window
	lanesTail      = 500 * time.Millisecond // after it: for the takeover
	lanesWindow    = 50 * time.Millisecond  // the takeover's window
	lanesPace      = 200 * time.Millisecond // between interactive calls: 5 a second
	lanesArrive    = time.Second            // the cost case's callers arrive over this long
	lanesPool      = 200                    // connections a worker at most
	lanesLookahead = 20 * time.Millisecond  // the bucket's default

	// The callers of each lane.
	lanesFairA = 200
	lanesFairB = 5
	lanesFairC = 50 // weight 2
	lanesBatch = 400
)

// The goals.
const (
	lanesShareTol  = 0.05 // of a lane's due
	lanesUtilGoal  = 0.99
	lanesTakeGoal  = 100 * time.Millisecond
	lanesTakeLevel = 0.95 // of the limit: a stopped lane's share taken
	lanesCostGoal  = 1.5  // a lane each against one lane, the step per grant
)

func (*Lanes) about() about {
	return about{name: "lanes", takes: "~30 s", all: true,
		what: "one quota shared by lanes in 4 processes: weighted fair shares and a stopped lane's share taken over, an interactive lane's wait behind a batch, the scheduler's cost with 10,000 lanes against one"}
}

func (ln *Lanes) flags(fs *flag.FlagSet) {
	fs.IntVar(&ln.Procs, "lanes-procs", 4, "worker processes the callers of each case are spread over")
	fs.DurationVar(&ln.Duration, "lanes-duration", 2*time.Second, "each case's measured window, after a warm-up of 500ms")
	fs.IntVar(&ln.Tenants, "lanes-tenants", 10000, "callers of the cost case, one lane each (then all in one lane)")
	fs.StringVar(&ln.cases, "lanes-cases", "fair,priority,cost", "the cases to run, comma-separated")
}

func (ln *Lanes) picked() ([]string, error) {
	names := strings.Split(strings.ReplaceAll(ln.cases, " ", ""), ",")
	for _, n := range names {
		if !slices.Contains([]string{"fair", "priority", "cost"}, n) {
			return nil, fmt.Errorf("--lanes-cases %q: no case %q (fair, priority, cost)", ln.cases, n)
		}
	}
	return names, nil
}

func (ln *Lanes) check() error {
	if _, err := ln.picked(); err != nil {
		return err
	}
	switch {
	case ln.Procs < 1 || ln.Procs > lanesFairB:
		return fmt.Errorf("--lanes-procs %d: want between 1 and %d", ln.Procs, lanesFairB)
	case ln.Duration < 10*lanesWindow:
		return fmt.Errorf("--lanes-duration %v: want ≥ %v", ln.Duration, 10*lanesWindow)
	case ln.Tenants < max(ln.Procs, 2):
		return fmt.Errorf("--lanes-tenants %d: want ≥ 2 and ≥ --lanes-procs (%d)", ln.Tenants, ln.Procs)
	}
	return nil
}

func (ln *Lanes) run(ctx context.Context, e *env) error {
	cases, _ := ln.picked()
	ln.Fair, ln.Priority, ln.Cost = nil, nil, nil
	var err error
	if slices.Contains(cases, "fair") {
		e.logf("lanes: fair share: lanes A (%d callers), B (%d), C (weight 2, %d) in %d processes for %v, then C stops...", lanesFairA, lanesFairB, lanesFairC, ln.Procs, ln.Duration)
		if ln.Fair, err = ln.runFair(ctx, e); err != nil {
			return fmt.Errorf("fair: %w", err)
		}
	}
	if slices.Contains(cases, "priority") {
		e.logf("lanes: priority: a batch of %d callers, an interactive call every %v, for %v...", lanesBatch, lanesPace, ln.Duration)
		if ln.Priority, err = ln.runPriority(ctx, e); err != nil {
			return fmt.Errorf("priority: %w", err)
		}
	}
	if slices.Contains(cases, "cost") {
		e.logf("lanes: cost: %d callers, a lane each, then one lane...", ln.Tenants)
		if ln.Cost, err = ln.runCost(ctx, e); err != nil {
			return fmt.Errorf("cost: %w", err)
		}
	}
	return nil
}

func (ln *Lanes) runFair(ctx context.Context, e *env) (*LanesFair, error) {
	cut := lanesWarmup + ln.Duration + lanesCutAfter
	loads := []LaneShare{{Lane: "A", Weight: 1, Callers: lanesFairA}, {Lane: "B", Weight: 1, Callers: lanesFairB}, {Lane: "C", Weight: 2, Callers: lanesFairC}}
	procs := make([][]lanesGroup, ln.Procs)
	weights := 0
	for _, l := range loads {
		g := lanesGroup{Lane: l.Lane}
		if l.Lane == "C" {
			g.Cut = cut
		}
		spread(procs, l.Callers, g)
		weights += l.Weight
	}
	recs, run, err := runLanes(ctx, e, lanesConfig(e.name+"-fair", bucket.Lane{Name: "C", Weight: 2}), procs, cut+lanesTail, nil)
	out := &LanesFair{lanesRun: run, Takeover: -1}
	if err != nil || len(recs) == 0 {
		return out, err
	}
	from, to := recs[0].Slot.Add(lanesWarmup), recs[0].Slot.Add(lanesWarmup+ln.Duration)
	in, late := map[string]int{}, map[string]int{}
	var lastC time.Time
	var others []time.Time // A's and B's, in order
	for _, r := range recs {
		if r.Lane == "C" {
			lastC = r.Slot
		} else {
			others = append(others, r.Slot)
		}
		if !r.Slot.Before(from) && r.Slot.Before(to) {
			in[r.Lane]++
			late[r.Lane] += r.Late
		}
	}
	all := 0
	for _, l := range loads {
		all += in[l.Lane]
		l.Rate, l.Due, l.Late = float64(in[l.Lane])/ln.Duration.Seconds(), lanesRate()*float64(l.Weight)/float64(weights), late[l.Lane]
		out.Lanes = append(out.Lanes, l)
	}
	out.Utilization = float64(all) / (lanesRate() * ln.Duration.Seconds())
	out.Takeover = takeover(others, lastC, recs[len(recs)-1].Slot, lanesWindow, lanesTakeLevel*lanesRate()*lanesWindow.Seconds())
	return out, nil
}

func (ln *Lanes) runPriority(ctx context.Context, e *env) (*LanesPrio, error) {
	out := &LanesPrio{Calls: int(ln.Duration / lanesPace)}
	var err error
	if out.RTT, err = pingRTT(ctx, e); err != nil {
		return out, err
	}
	procs := make([][]lanesGroup, ln.Procs)
	spread(procs, lanesBatch, lanesGroup{Lane: "batch"})
	for i := range procs {
		// Calls i, i+procs, ... of the interactive lane: one Enter each.
		if n := share(out.Calls, ln.Procs, i); n > 0 {
			procs[i] = append(procs[i], lanesGroup{Lane: "interactive", Callers: n, Enters: 1,
				At: lanesWarmup + time.Duration(i)*lanesPace, Spread: time.Duration(n*ln.Procs) * lanesPace})
		}
	}
	end := lanesWarmup + ln.Duration + 2*lanesLookahead
	recs, run, err := runLanes(ctx, e, lanesConfig(e.name+"-priority", bucket.Lane{Name: "interactive", Priority: 1}), procs, end, nil)
	out.lanesRun = run
	if err != nil || len(recs) == 0 {
		return out, err
	}
	from, to := recs[0].Slot.Add(lanesWarmup), recs[0].Slot.Add(lanesWarmup+ln.Duration)
	var waits []time.Duration
	all, batch := 0, 0
	for _, r := range recs {
		if r.Lane == "interactive" {
			waits = append(waits, r.Wait)
		}
		if !r.Slot.Before(from) && r.Slot.Before(to) {
			all++
			if r.Lane == "batch" {
				batch++
			}
		}
	}
	out.Wait = distOf(waits)
	out.Batch = float64(batch) / ln.Duration.Seconds()
	out.Utilization = float64(all) / (lanesRate() * ln.Duration.Seconds())
	return out, nil
}

// WaitGoal is 2 refill periods and a round trip.
func (p LanesPrio) WaitGoal() time.Duration { return 2*lanesLimit.RefillFrequency + p.RTT }

func (s LaneShare) met() bool { return math.Abs(s.Rate/s.Due-1) <= lanesShareTol }

func (ln *Lanes) table(t *table, _ Limit) {
	t.title("LANES: one bucket of %s/s, burst %d, shared by lanes of callers in %d processes; each case measured over %v after a warm-up of %v, every grant's slot judged",
		num(lanesRate()), lanesLimit.Capacity, ln.Procs, ln.Duration, lanesWarmup)
	if f := ln.Fair; f != nil {
		t.row("fair share", "grants/s", fmt.Sprintf("lanes A (%d callers), B (%d) and C (weight 2, %d callers) loop on Enter: each is due min(its demand, its weight's share), its weight's share as its callers loop", lanesFairA, lanesFairB, lanesFairC))
		for _, l := range f.Lanes {
			t.row("  lane "+l.Lane, num(l.Rate), fmt.Sprintf("%s: %.3f× its due %s/s (weight %d, %d callers); %d of its grants retimed or claimed", t.goal(l.met(), "within ±5 %"), l.Rate/l.Due, num(l.Due), l.Weight, l.Callers, l.Late))
		}
		t.row("  utilization", fmt.Sprintf("%.2f %%", 100*f.Utilization), t.goal(f.Utilization >= lanesUtilGoal, "≥ 99 %")+": the lanes' grants over what the limit allows in the window (more when the bucket enters it with tokens)")
		take := "none by the end"
		if f.Takeover >= 0 {
			take = dur(f.Takeover)
		}
		t.row("  C stopped: A and B take its share after", take, t.goal(f.Takeover >= 0 && f.Takeover <= lanesTakeGoal, "≤ 100 ms")+
			fmt.Sprintf(": from C's last grant to the first %v in which A and B were granted ≥ 95 %% of the limit (C's callers cancelled %v after the window); one refill period (%v) at best", dur(lanesWindow), dur(lanesCutAfter), dur(lanesLimit.RefillFrequency)))
		runRows(t, "  excess over the limit", f.lanesRun)
	}
	if p := ln.Priority; p != nil {
		t.row("priority", "", fmt.Sprintf("lane batch: %d callers loop on Enter; lane interactive (priority 1): one call every %v, each its own goroutine", lanesBatch, dur(lanesPace)))
		t.row("  interactive wait p50 / p99", dur(p.Wait.P50)+" / "+dur(p.Wait.P99), fmt.Sprintf("%s: %d of %d calls granted, the longest %s; Enter's call to its return",
			t.goal(p.Wait.N > 0 && p.Wait.P99 <= p.WaitGoal(), fmt.Sprintf("p99 ≤ 2 refill periods + a round trip (%s)", dur(p.WaitGoal()))), p.Wait.N, p.Calls, dur(p.Wait.Max)))
		t.row("  utilization", fmt.Sprintf("%.2f %%", 100*p.Utilization), t.goal(p.Utilization >= lanesUtilGoal, "≥ 99 %")+fmt.Sprintf(": both lanes' grants over what the limit allows; the batch got %s/s", num(p.Batch)))
		runRows(t, "  excess over the limit", p.lanesRun)
	}
	if c := ln.Cost; c != nil {
		c.table(t, ln)
	}
}

// runRows writes a run's excess and errors.
func runRows(t *table, label string, r lanesRun) {
	errs := fmt.Sprintf("%d errors", r.Errors)
	if r.Err != "" {
		errs += "; first: " + r.Err
	}
	t.row(label, fmt.Sprint(max(r.Excess, 0)), t.goal(r.Excess <= 0, "0")+fmt.Sprintf(": %s grants judged by grant time, the busiest window %s; %s", commas(r.Grants), vsLimit(r.Excess), errs))
}

func (ln *Lanes) gobench(g *gobench) {
	if fa := ln.Fair; fa != nil {
		m := []any{f(fa.Utilization), "utilization", ms(fa.Takeover), "ms-takeover", max(fa.Excess, 0), "excess"}
		for _, l := range fa.Lanes {
			m = append(m, f(l.Rate), l.Lane+"-grants/s")
		}
		g.line("Lanes/fair", fa.Grants, m...)
	}
	if p := ln.Priority; p != nil {
		g.line("Lanes/priority", p.Grants, ms(p.Wait.P50), "ms-interactive-p50", ms(p.Wait.P99), "ms-interactive-p99", f(p.Utilization), "utilization", max(p.Excess, 0), "excess")
	}
	if c := ln.Cost; c != nil {
		c.gobench(g)
	}
}
