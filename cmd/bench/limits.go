package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"image/color"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
)

// Limits is a live change of the limit under saturated load: callers in
// worker processes saturate one bucket while this process changes its
// limit with SetPolicies, one step every Phase. Each phase's grants are
// judged against its own limit: the slots before a change against the old
// limit, those after it against the new one (a slot between the start and
// the end of a change is judged against both, as it may belong to either).
type Limits struct {
	Callers int           `json:"callers"`
	Procs   int           `json:"procs"`
	Phase   time.Duration `json:"phase_ns"`
	// Rates are the limits, per second, one per phase; each is 1 token
	// every 1 s ÷ rate, with a burst (capacity) of 50 ms of it.
	Rates  []int  `json:"rates_per_s"`
	Tokens string `json:"tokens"` // how tokens carry over (bucket.Carry)
	LimitsFigures

	rates  string // --limits-rates, parsed into Rates by check
	plot   string // --limits-plot: the file to draw
	tokens bucket.Carry
}

// LimitsFigures is the judgement of every grant of a limits run.
type LimitsFigures struct {
	Grants int    `json:"grants"` // successful Enters
	Errors int    `json:"errors"` // failed Enters
	Err    string `json:"first_error,omitempty"`
	Phases []LimitsPhase
}

// LimitsPhase is one limit of the run and what was granted under it.
type LimitsPhase struct {
	Capacity        int           `json:"capacity"`
	RefillAmount    int           `json:"refill_amount"`
	RefillFrequency time.Duration `json:"refill_frequency_ns"`

	// Change is how long the SetPolicies call that put this limit in force
	// took, from its call to its return (0 for the first phase: the
	// limit the bucket started with).
	Change time.Duration `json:"change_ns"`
	// Reach is, per worker process, the time from the SetPolicies call to
	// the process's first grant (Enter returned) whose slot was assigned
	// under the new limit: a slot more than the lookahead (20 ms) after
	// SetPolicies returned, since slots are handed out at most that far
	// ahead (those handed out before the change keep their times).
	// ReachMax is the largest, the time the change took to reach every
	// process. A process that had no such grant is -1 (and ReachMax is
	// then -1 too).
	Reach    []time.Duration `json:"reach_ns,omitempty"`
	ReachMax time.Duration   `json:"reach_max_ns"`

	// Judged counts the slots judged against this limit: from the start
	// of its change (the first slot for the first phase) to the end of
	// the next change (the last slot for the last phase).
	Judged int `json:"judged"`
	// ExcessSlots is the busiest window of those slots: grants in it
	// minus what the limit allows there (≤ 0: the promise held).
	// ExcessStarts is the same for the instants Enter returned, each
	// window judged MaxLateness + 2 ms longer, as the bucket promises for
	// starts.
	ExcessSlots  int `json:"excess_slots"`
	ExcessStarts int `json:"excess_starts_slack"`
	// Steady counts the slots in the middle half of the phase, away
	// from the changes; Rate is them per second, Utilization Rate over
	// the limit.
	Steady      int     `json:"steady"`
	Rate        float64 `json:"rate_per_s"`
	Utilization float64 `json:"utilization"`
}

func (p LimitsPhase) limit() guarantee.Limit {
	return guarantee.Limit{Capacity: p.Capacity, RefillAmount: p.RefillAmount, RefillFrequency: p.RefillFrequency}
}

func (p LimitsPhase) perSecond() float64 {
	return float64(p.RefillAmount) / p.RefillFrequency.Seconds()
}

// limitsChange is one SetPolicies call as this process timed it: from its
// call to its return.
type limitsChange struct{ from, to time.Time }

// The goal the run is held to, besides no excess.
const limitsUtilizationGoal = 0.95

// defaultLookahead is the bucket's, as its Config documents it.
const defaultLookahead = 20 * time.Millisecond

func (*Limits) about() about {
	return about{name: "limits", takes: "~6 s", all: true,
		what: "callers in several processes saturate one bucket while its limit is changed live (SetPolicies): each phase judged against its limit, the time a change takes to reach every process"}
}

func (l *Limits) flags(fs *flag.FlagSet) {
	fs.IntVar(&l.Callers, "limits-callers", 60, "callers in total, spread over the processes")
	fs.IntVar(&l.Procs, "limits-procs", 3, "worker processes (1: the callers run in this process)")
	fs.DurationVar(&l.Phase, "limits-phase", 1500*time.Millisecond, "how long each limit stays in force before the next")
	fs.StringVar(&l.rates, "limits-rates", "200,50,400", "the limits, in calls per second, in the order they are set (`LIST`); each has a burst of 50 ms of it")
	fs.StringVar(&l.Tokens, "limits-tokens", "proportionally", "how tokens carry over at a change (bucket.Carry): proportionally, as-is or fill")
	fs.StringVar(&l.plot, "limits-plot", "", "draw the grant rate over time against each phase's limit to `FILE` (.svg or .png)")
}

func (l *Limits) check() error {
	if l.Phase <= 0 {
		return fmt.Errorf("--limits-phase %v: want > 0", l.Phase)
	}
	if err := checkLoad("limits-", l.Callers, l.Procs, l.Phase); err != nil {
		return err
	}
	l.Rates = nil
	for _, f := range strings.Split(l.rates, ",") {
		r, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || r < 1 || r > 1_000_000 {
			return fmt.Errorf("--limits-rates %q: want calls per second between 1 and 1,000,000, separated by commas", l.rates)
		}
		l.Rates = append(l.Rates, r)
	}
	if len(l.Rates) < 2 {
		return fmt.Errorf("--limits-rates %q: want at least two limits, to change from one to the next", l.rates)
	}
	switch l.Tokens {
	case "proportionally":
		l.tokens = bucket.Proportionally
	case "as-is":
		l.tokens = bucket.AsIs
	case "fill":
		l.tokens = bucket.Fill
	default:
		return fmt.Errorf("--limits-tokens %q: want proportionally, as-is or fill", l.Tokens)
	}
	return nil
}

// limitsPolicy is the policy of rate calls per second: 1 token every
// 1 s ÷ rate (whole µs), a burst of 50 ms of it.
func limitsPolicy(rate int) bucket.Policy {
	every := max(time.Second/time.Duration(rate), time.Microsecond).Truncate(time.Microsecond)
	return bucket.Policy{Capacity: max(rate/20, 1), RefillAmount: 1, RefillFrequency: every}
}

// run has the callers saturate a bucket of the first limit for a phase
// per limit, changes the limit from this process at the start of every
// phase after the first, then judges every grant against the limit of its
// phase.
func (l *Limits) run(ctx context.Context, e *env) error {
	ps := make([]bucket.Policy, len(l.Rates))
	for i, r := range l.Rates {
		ps[i] = limitsPolicy(r)
	}
	cfg := bucket.Config{Name: e.name, Capacity: ps[0].Capacity, RefillAmount: ps[0].RefillAmount, RefillFrequency: ps[0].RefillFrequency}
	until := time.Duration(len(ps)) * l.Phase
	// Under the slowest limit a caller that re-enters waits for all the
	// others; wait much longer before giving up on a stuck Enter.
	slowest := slices.Min(l.Rates)
	turn := time.Duration(float64(l.Callers) / float64(slowest) * float64(time.Second))
	e.logf("limits: %d callers in %d process(es), the limit changed every %v: %s/s...", l.Callers, l.Procs, l.Phase, strings.ReplaceAll(l.rates, ",", "/s → "))
	specs := make([]loadgen.Spec, l.Procs)
	for i := range specs {
		specs[i] = loadgen.Spec{Proc: i, Addr: e.opt.Addr, URL: e.url, Bucket: cfg, Callers: share(l.Callers, l.Procs, i),
			Until: until, Timeout: 30*time.Second + 4*turn}
	}
	rdb := client(e.opt, 2)
	defer rdb.Close()
	admin, err := bucket.New(rdb, cfg)
	if err != nil {
		return err
	}
	defer admin.Close()

	var (
		grants  []loadgen.Grant
		loadErr error
		load    sync.WaitGroup
	)
	start := time.Now()
	if l.Procs > 1 {
		start = start.Add(workerStartup) // inWorkers starts the workers' callers together then
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	load.Go(func() {
		if l.Procs == 1 {
			grants, _, loadErr = inProcess(runCtx, e.opt, specs[0])
		} else {
			grants, _, loadErr = inWorkers(runCtx, specs, e.log)
		}
	})
	changes, changeErr := l.change(runCtx, admin, ps, start)
	if changeErr != nil {
		cancel() // the load has no point now
	}
	load.Wait()
	if changeErr != nil {
		return changeErr
	}
	if loadErr != nil {
		return loadErr
	}
	l.LimitsFigures = judgeLimits(grants, ps, changes, l.Phase, l.Procs, cmp.Or(cfg.Lookahead, defaultLookahead), cmp.Or(cfg.MaxLateness, defaultMaxLateness))
	if l.plot != "" {
		if err := writeLimitsPlot(l.plot, grants, l.Phases, changes); err != nil {
			return err
		}
		e.logf("limits: plot written to %s", l.plot)
	}
	return nil
}

// change sets ps[i] at start + i × Phase, for each i ≥ 1, and checks that
// it is then the limit in force; it returns when each call was made and
// returned.
func (l *Limits) change(ctx context.Context, admin *bucket.Bucket, ps []bucket.Policy, start time.Time) ([]limitsChange, error) {
	changes := make([]limitsChange, 0, len(ps)-1)
	for i, p := range ps[1:] {
		t := time.NewTimer(time.Until(start.Add(time.Duration(i+1) * l.Phase)))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
		from := time.Now()
		if err := admin.SetPolicies(ctx, l.tokens, p); err != nil {
			return nil, fmt.Errorf("SetPolicies to %s/s: %w", num(1/p.RefillFrequency.Seconds()), err)
		}
		changes = append(changes, limitsChange{from: from, to: time.Now()})
		got, err := admin.Policies(ctx)
		if err != nil {
			return nil, err
		}
		if len(got) != 1 || got[0] != p {
			return nil, fmt.Errorf("after SetPolicies(%+v), the limits in force are %+v", p, got)
		}
	}
	return changes, nil
}

// judgeLimits judges the grants of a limits run: phase i ran under ps[i]
// for about phase, and changes[i-1] put it in force. procs is how many
// processes entered (Grant.Proc from 0); lookahead and maxLate are the
// bucket's Lookahead and MaxLateness.
func judgeLimits(grants []loadgen.Grant, ps []bucket.Policy, changes []limitsChange, phase time.Duration, procs int, lookahead, maxLate time.Duration) LimitsFigures {
	var lf LimitsFigures
	var ok []loadgen.Grant
	for _, g := range grants {
		if !g.OK() {
			lf.Errors++
			if lf.Err == "" {
				lf.Err = g.Err
			}
			continue
		}
		ok = append(ok, g)
	}
	lf.Grants = len(ok)
	if len(ok) == 0 {
		return lf
	}
	first := slices.MinFunc(ok, func(a, b loadgen.Grant) int { return cmp.Compare(a.Slot, b.Slot) }).SlotTime()
	for i, p := range ps {
		ph := LimitsPhase{Capacity: p.Capacity, RefillAmount: p.RefillAmount, RefillFrequency: p.RefillFrequency}
		// The slots judged: from this phase's change to the end of the
		// next one.
		from, until, begin := time.Time{}, time.Time{}, first
		if i > 0 && i-1 < len(changes) {
			c := changes[i-1]
			from, begin = c.from, c.to
			ph.Change = c.to.Sub(c.from)
			ph.Reach, ph.ReachMax = reach(ok, c, procs, lookahead)
		}
		if i < len(changes) {
			until = changes[i].to
		}
		var slots []guarantee.Grant
		var starts []guarantee.Grant
		mid0, mid1 := begin.Add(phase/4), begin.Add(3*phase/4)
		for _, g := range ok {
			s := g.SlotTime()
			if s.Before(from) || (!until.IsZero() && !s.Before(until)) {
				continue
			}
			slots = append(slots, guarantee.Grant{At: s, Cost: 1})
			starts = append(starts, guarantee.Grant{At: g.Time(), Cost: 1})
			if !s.Before(mid0) && s.Before(mid1) {
				ph.Steady++
			}
		}
		ph.Judged = len(slots)
		ph.ExcessSlots = guarantee.CheckCosts(slots, ph.limit(), 0).Excess
		ph.ExcessStarts = guarantee.CheckCosts(starts, ph.limit(), maxLate+startSlack).Excess
		if half := mid1.Sub(mid0); half > 0 {
			ph.Rate = float64(ph.Steady) / half.Seconds()
			ph.Utilization = ph.Rate / ph.perSecond()
		}
		lf.Phases = append(lf.Phases, ph)
	}
	return lf
}

// reach is, for each of procs processes, the time from c's call to the
// first grant the process returned whose slot falls more than lookahead
// after c returned (so was assigned after it), and the largest of them;
// -1 for a process with none.
func reach(grants []loadgen.Grant, c limitsChange, procs int, lookahead time.Duration) ([]time.Duration, time.Duration) {
	firsts := make([]time.Time, procs)
	after := c.to.Add(lookahead)
	for _, g := range grants {
		if g.Proc < 0 || g.Proc >= procs || !g.SlotTime().After(after) {
			continue
		}
		if t := g.Time(); firsts[g.Proc].IsZero() || t.Before(firsts[g.Proc]) {
			firsts[g.Proc] = t
		}
	}
	out := make([]time.Duration, procs)
	var worst time.Duration
	for p, t := range firsts {
		if t.IsZero() {
			out[p], worst = -1, -1
			continue
		}
		out[p] = t.Sub(c.from)
		if worst >= 0 {
			worst = max(worst, out[p])
		}
	}
	return out, worst
}

func (l *Limits) table(t *table, _ Limit) {
	rates := make([]string, len(l.Rates))
	for i, r := range l.Rates {
		rates[i] = commas(r) + "/s"
	}
	t.title("LIMITS: %d callers in %d process(es) saturate one bucket while this process changes its limit with SetPolicies every %v: %s (tokens carried over %s)",
		l.Callers, l.Procs, l.Phase, strings.Join(rates, " → "), l.Tokens)
	note := fmt.Sprintf("%d errors", l.Errors)
	if l.Err != "" {
		note += "; first: " + l.Err
	}
	t.row("grants", commas(l.Grants), note)
	for i, p := range l.Phases {
		t.row(fmt.Sprintf("phase %d: %s/s", i+1, num(p.perSecond())), "", fmt.Sprintf("capacity %s, %d every %v", commas(p.Capacity), p.RefillAmount, p.RefillFrequency))
		if i > 0 {
			t.row("  SetPolicies round trip", dur(p.Change), "from the call to its return, in this process")
			reach := "a process had no grant after the change"
			if p.ReachMax >= 0 {
				reach = dur(p.ReachMax)
			}
			per := make([]string, len(p.Reach))
			for k, r := range p.Reach {
				per[k] = "–"
				if r >= 0 {
					per[k] = dur(r)
				}
			}
			t.row("  until every process had a grant under it", reach,
				fmt.Sprintf("per process: %s, from the call to the return of its first Enter given its grant time under the new limit (> %s after the call: the bucket assigns grant times up to that far ahead); it includes the process's turn in the queue, at one grant every %s", strings.Join(per, ", "), dur(defaultLookahead), dur(p.RefillFrequency)))
		}
		t.row("  grant rate, middle half of the phase", num(p.Rate)+"/s",
			fmt.Sprintf("%s; %.1f %% of the limit, %d grants", t.goal(p.Utilization >= limitsUtilizationGoal, fmt.Sprintf("≥ %.0f %% of the limit", 100*limitsUtilizationGoal)), 100*p.Utilization, p.Steady))
		span := "from the first grant time"
		if i > 0 {
			span = "from its change"
		}
		if i+1 < len(l.Phases) {
			span += " to the end of the next change"
		} else {
			span += " to the last grant time"
		}
		t.row("  busiest window, grant times", vsLimit(p.ExcessSlots), fmt.Sprintf("%s; %s grants %s, judged against this limit", t.goal(p.ExcessSlots <= 0, "never over"), commas(p.Judged), span))
		t.row(fmt.Sprintf("  busiest window, start times, windows %s longer", dur(defaultMaxLateness+startSlack)), vsLimit(p.ExcessStarts),
			t.goal(p.ExcessStarts <= 0, "never over")+"; a start may come up to MaxLateness (and the reply's trip) after its grant time")
	}
}

func (l *Limits) gobench(g *gobench) {
	g.line("Limits", l.Grants, l.Errors, "errors")
	for i, p := range l.Phases {
		g.line(fmt.Sprintf("Limits/phase-%d-%s-per-s", i+1, num(p.perSecond())), p.Judged,
			f(p.Rate), "grants/s", f(p.Utilization), "utilization",
			p.ExcessSlots, "excess-slots", p.ExcessStarts, "excess-starts-slack",
			ms(p.Change), "ms-change", ms(p.ReachMax), "ms-reach")
	}
}

// writeLimitsPlot draws the limits run to path (.svg or .png): grants per
// 100 ms, by slot and by start, as a rate, against the limit of each
// phase, with the changes marked.
func writeLimitsPlot(path string, grants []loadgen.Grant, phases []LimitsPhase, changes []limitsChange) error {
	const bin = 100 * time.Millisecond
	var slots, starts []time.Time
	for _, g := range grants {
		if g.OK() {
			slots, starts = append(slots, g.SlotTime()), append(starts, g.Time())
		}
	}
	if len(slots) < 2 {
		return fmt.Errorf("plot: %d grants, too few to draw", len(slots))
	}
	slices.SortFunc(slots, time.Time.Compare)
	slices.SortFunc(starts, time.Time.Compare)
	t0 := slots[0]
	sec := func(t time.Time) float64 { return t.Sub(t0).Seconds() }
	end := math.Max(sec(slots[len(slots)-1]), sec(starts[len(starts)-1]))
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Grant rate (grants per %v) as SetPolicies changes the limit", bin)
	p.X.Label.Text = "s since the first grant time"
	p.Y.Label.Text = "grants/s"
	p.Legend.Top = true
	// The limit in force: a step at each change (drawn at its return).
	var lim plotter.XYs
	top := 0.0
	for i, ph := range phases {
		x := 0.0
		if i > 0 && i-1 < len(changes) {
			x = sec(changes[i-1].to)
		}
		if i > 0 {
			lim = append(lim, plotter.XY{X: x, Y: lim[len(lim)-1].Y})
		}
		lim = append(lim, plotter.XY{X: x, Y: ph.perSecond()})
		top = math.Max(top, ph.perSecond())
	}
	lim = append(lim, plotter.XY{X: end, Y: lim[len(lim)-1].Y})
	binned := func(ts []time.Time) plotter.XYs { return binCounts(ts, sec, bin, end, bin.Seconds()) }
	for _, c := range changes {
		x := sec(c.from)
		if err := addLine(p, plotter.XYs{{X: x, Y: 0}, {X: x, Y: 1.25 * top}}, color.Gray{Y: 150}, true, ""); err != nil {
			return err
		}
	}
	if err := addLine(p, lim, colLimit, true, "limit in force", vg.Points(2)); err != nil {
		return err
	}
	if err := addLine(p, binned(slots), colSlot, false, "grant times (Redis's clock)"); err != nil {
		return err
	}
	if err := addLine(p, binned(starts), colStart, false, "start times (Enter returned)"); err != nil {
		return err
	}
	p.Y.Min, p.Y.Max = 0, math.Max(p.Y.Max, 1.25*top)
	return saveTiles(path, [][]*plot.Plot{{p}}, 30*vg.Centimeter, 14*vg.Centimeter)
}
