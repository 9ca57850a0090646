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

// PolicyChange is a live change of the policies under saturated load:
// callers in worker processes saturate one bucket while this process
// changes its policy with SetPolicies, one step every Phase. Each phase's
// grants are judged against its own policy: the slots before a change
// against the old policy, those after it against the new one (a slot
// between the start and the end of a change is judged against both, as it
// may belong to either).
type PolicyChange struct {
	Callers int           `json:"callers"`
	Procs   int           `json:"procs"`
	Phase   time.Duration `json:"phase_ns"`
	// Rates are the policies' rates, per second, one per phase; each
	// policy is 1 token every 1 s ÷ rate, with a burst (capacity) of
	// 50 ms of it.
	Rates []int `json:"rates_per_s"`
	// Carry is how free tokens carry over at a change (bucket.Carry), in
	// the words of sluice set-policies --carry: proportional, as-is or
	// fill.
	Carry string `json:"carry"`
	PolicyChangeFigures

	rates string // --change-rates, parsed into Rates by check
	plot  string // --change-plot: the file to draw
	carry bucket.Carry
}

// PolicyChangeFigures is the judgement of every grant of a policy-change
// run.
type PolicyChangeFigures struct {
	Grants int    `json:"grants"` // successful Enters
	Errors int    `json:"errors"` // failed Enters
	Err    string `json:"first_error,omitempty"`
	Phases []PolicyChangePhase
}

// PolicyChangePhase is one policy of the run and what was granted under
// it.
type PolicyChangePhase struct {
	Capacity        int           `json:"capacity"`
	RefillAmount    int           `json:"refill_amount"`
	RefillFrequency time.Duration `json:"refill_frequency_ns"`

	// Change is how long the SetPolicies call that put this policy in
	// force took, from its call to its return (0 for the first phase: the
	// policy the bucket started with).
	Change time.Duration `json:"change_ns"`
	// Reach is, per worker process, the time from the SetPolicies call to
	// the process's first grant (Enter returned) whose slot was assigned
	// under the new policy: a slot more than the lookahead (20 ms) after
	// SetPolicies returned, since slots are handed out at most that far
	// ahead (those handed out before the change keep their times).
	// ReachMax is the largest, the time the change took to reach every
	// process. A process that had no such grant is -1 (and ReachMax is
	// then -1 too).
	Reach    []time.Duration `json:"reach_ns,omitempty"`
	ReachMax time.Duration   `json:"reach_max_ns"`

	// Judged counts the slots judged against this policy: from the start
	// of its change (the first slot for the first phase) to the end of
	// the next change (the last slot for the last phase).
	Judged int `json:"judged"`
	// ExcessSlots is the busiest window of those slots: grants in it
	// minus what the policy allows there (≤ 0: the promise held).
	// ExcessStarts is the same for the instants Enter returned, each
	// window judged MaxLateness + 2 ms longer, as the bucket promises for
	// starts.
	ExcessSlots  int `json:"excess_slots"`
	ExcessStarts int `json:"excess_starts_slack"`
	// Steady counts the slots in the middle half of the phase, away
	// from the changes; Rate is them per second, Utilization Rate over
	// the policy's rate.
	Steady      int     `json:"steady"`
	Rate        float64 `json:"rate_per_s"`
	Utilization float64 `json:"utilization"`
}

func (p PolicyChangePhase) limit() guarantee.Limit {
	return guarantee.Limit{Capacity: p.Capacity, RefillAmount: p.RefillAmount, RefillFrequency: p.RefillFrequency}
}

func (p PolicyChangePhase) perSecond() float64 {
	return float64(p.RefillAmount) / p.RefillFrequency.Seconds()
}

// changeCall is one SetPolicies call as this process timed it: from its
// call to its return.
type changeCall struct{ from, to time.Time }

// The goal the run is held to, besides no excess.
const changeUtilizationGoal = 0.95

// defaultLookahead is the bucket's, as its Config documents it.
const defaultLookahead = 20 * time.Millisecond

func (*PolicyChange) about() about {
	return about{name: "policy-change", takes: "~6 s", all: true,
		what:  "callers in several processes saturate one bucket while its policy is changed live (SetPolicies): each phase judged against its own policy, the time a change takes to reach every process",
		needs: "it judges the grants made while a change is in flight against both policies, which is fair while a change takes about a millisecond, as on redis-server; on miniredis one takes tens of milliseconds under this load, and the old policy's grants meanwhile would read as over the new one's limit"}
}

func (c *PolicyChange) flags(fs *flag.FlagSet) {
	fs.IntVar(&c.Callers, "change-callers", 60, "callers in total, spread over the processes")
	fs.IntVar(&c.Procs, "change-procs", 3, "worker processes (1: the callers run in this process)")
	fs.DurationVar(&c.Phase, "change-phase", 1500*time.Millisecond, "how long each policy stays in force before the next")
	fs.StringVar(&c.rates, "change-rates", "200,50,400", "the policies' rates, in calls per second, in the order they are set (`LIST`); each has a burst of 50 ms of it")
	fs.StringVar(&c.Carry, "change-carry", "proportional", "`RULE`: how the free tokens carry over at a change (bucket.Carry), as sluice set-policies --carry: proportional (scaled by new ÷ old capacity), as-is (kept, at most the new capacity) or fill (full)")
	fs.StringVar(&c.plot, "change-plot", "", "draw the grant rate over time against each phase's policy to `FILE` (.svg or .png)")
}

func (c *PolicyChange) check() error {
	if c.Phase <= 0 {
		return fmt.Errorf("--change-phase %v: want > 0", c.Phase)
	}
	if err := checkLoad("change-", c.Callers, c.Procs, c.Phase); err != nil {
		return err
	}
	c.Rates = nil
	for _, f := range strings.Split(c.rates, ",") {
		r, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || r < 1 || r > 1_000_000 {
			return fmt.Errorf("--change-rates %q: want calls per second between 1 and 1,000,000, separated by commas", c.rates)
		}
		c.Rates = append(c.Rates, r)
	}
	if len(c.Rates) < 2 {
		return fmt.Errorf("--change-rates %q: want at least two rates, to change from one policy to the next", c.rates)
	}
	switch c.Carry {
	case "proportional":
		c.carry = bucket.Proportionally
	case "as-is":
		c.carry = bucket.AsIs
	case "fill":
		c.carry = bucket.Fill
	default:
		return fmt.Errorf("--change-carry %q: want proportional, as-is or fill", c.Carry)
	}
	return nil
}

// changePolicy is the policy of rate calls per second: 1 token every
// 1 s ÷ rate (whole µs), a burst of 50 ms of it.
func changePolicy(rate int) bucket.Policy {
	every := max(time.Second/time.Duration(rate), time.Microsecond).Truncate(time.Microsecond)
	return bucket.Policy{Capacity: max(rate/20, 1), RefillAmount: 1, RefillFrequency: every}
}

// run has the callers saturate a bucket of the first policy for a phase
// per policy, changes the policy from this process at the start of every
// phase after the first, then judges every grant against the policy of
// its phase.
func (c *PolicyChange) run(ctx context.Context, e *env) error {
	ps := make([]bucket.Policy, len(c.Rates))
	for i, r := range c.Rates {
		ps[i] = changePolicy(r)
	}
	cfg := bucket.Config{Name: e.name, Capacity: ps[0].Capacity, RefillAmount: ps[0].RefillAmount, RefillFrequency: ps[0].RefillFrequency}
	until := time.Duration(len(ps)) * c.Phase
	// Under the slowest policy a caller that re-enters waits for all the
	// others; wait much longer before giving up on a stuck Enter.
	slowest := slices.Min(c.Rates)
	turn := time.Duration(float64(c.Callers) / float64(slowest) * float64(time.Second))
	e.logf("policy-change: %d callers in %d process(es), the policy changed every %v: %s/s...", c.Callers, c.Procs, c.Phase, strings.ReplaceAll(c.rates, ",", "/s → "))
	specs := make([]loadgen.Spec, c.Procs)
	for i := range specs {
		specs[i] = loadgen.Spec{Proc: i, Addr: e.opt.Addr, URL: e.url, Bucket: cfg, Callers: share(c.Callers, c.Procs, i),
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
	if c.Procs > 1 {
		start = start.Add(workerStartup) // inWorkers starts the workers' callers together then
	}
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	load.Go(func() {
		if c.Procs == 1 {
			grants, _, loadErr = inProcess(runCtx, e.opt, specs[0])
		} else {
			grants, _, loadErr = inWorkers(runCtx, specs, e.log)
		}
	})
	changes, changeErr := c.change(runCtx, admin, ps, start)
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
	c.PolicyChangeFigures = judgePolicyChange(grants, ps, changes, c.Phase, c.Procs, cmp.Or(cfg.Lookahead, defaultLookahead), cmp.Or(cfg.MaxLateness, defaultMaxLateness))
	if c.plot != "" {
		if err := writePolicyChangePlot(c.plot, grants, c.Phases, changes); err != nil {
			return err
		}
		e.logf("policy-change: plot written to %s", c.plot)
	}
	return nil
}

// change sets ps[i] at start + i × Phase, for each i ≥ 1, and checks that
// it is then the policy in force; it returns when each call was made and
// returned.
func (c *PolicyChange) change(ctx context.Context, admin *bucket.Bucket, ps []bucket.Policy, start time.Time) ([]changeCall, error) {
	changes := make([]changeCall, 0, len(ps)-1)
	for i, p := range ps[1:] {
		t := time.NewTimer(time.Until(start.Add(time.Duration(i+1) * c.Phase)))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
		from := time.Now()
		if err := admin.SetPolicies(ctx, c.carry, p); err != nil {
			return nil, fmt.Errorf("SetPolicies to %s/s: %w", num(1/p.RefillFrequency.Seconds()), err)
		}
		changes = append(changes, changeCall{from: from, to: time.Now()})
		got, err := admin.Policies(ctx)
		if err != nil {
			return nil, err
		}
		if len(got) != 1 || got[0] != p {
			return nil, fmt.Errorf("after SetPolicies(%+v), the policies in force are %+v", p, got)
		}
	}
	return changes, nil
}

// judgePolicyChange judges the grants of a policy-change run: phase i ran
// under ps[i]
// for about phase, and changes[i-1] put it in force. procs is how many
// processes entered (Grant.Proc from 0); lookahead and maxLate are the
// bucket's Lookahead and MaxLateness.
func judgePolicyChange(grants []loadgen.Grant, ps []bucket.Policy, changes []changeCall, phase time.Duration, procs int, lookahead, maxLate time.Duration) PolicyChangeFigures {
	var lf PolicyChangeFigures
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
		ph := PolicyChangePhase{Capacity: p.Capacity, RefillAmount: p.RefillAmount, RefillFrequency: p.RefillFrequency}
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
func reach(grants []loadgen.Grant, c changeCall, procs int, lookahead time.Duration) ([]time.Duration, time.Duration) {
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

func (c *PolicyChange) table(t *table, _ Limit) {
	rates := make([]string, len(c.Rates))
	for i, r := range c.Rates {
		rates[i] = commas(r) + "/s"
	}
	t.title("POLICY CHANGE: %d callers in %d process(es) saturate one bucket while this process changes its policy with SetPolicies every %v: %s (free tokens carried over: %s)",
		c.Callers, c.Procs, c.Phase, strings.Join(rates, " → "), c.Carry)
	note := fmt.Sprintf("%d errors", c.Errors)
	if c.Err != "" {
		note += "; first: " + c.Err
	}
	t.row("grants", commas(c.Grants), note)
	for i, p := range c.Phases {
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
				fmt.Sprintf("per process: %s, from the call to the return of its first Enter given its grant time under the new policy (> %s after the call: the bucket assigns grant times up to that far ahead); it includes the process's turn in the queue, at one grant every %s", strings.Join(per, ", "), dur(defaultLookahead), dur(p.RefillFrequency)))
		}
		t.row("  grant rate, middle half of the phase", num(p.Rate)+"/s",
			fmt.Sprintf("%s; %.1f %% of the policy's rate, %d grants", t.goal(p.Utilization >= changeUtilizationGoal, fmt.Sprintf("≥ %.0f %% of the policy's rate", 100*changeUtilizationGoal)), 100*p.Utilization, p.Steady))
		span := "from the first grant time"
		if i > 0 {
			span = "from its change"
		}
		if i+1 < len(c.Phases) {
			span += " to the end of the next change"
		} else {
			span += " to the last grant time"
		}
		t.row("  busiest window, grant times", vsLimit(p.ExcessSlots), fmt.Sprintf("%s; %s grants %s, judged against this policy", t.goal(p.ExcessSlots <= 0, "never over"), commas(p.Judged), span))
		t.row(fmt.Sprintf("  busiest window, start times, windows %s longer", dur(defaultMaxLateness+startSlack)), vsLimit(p.ExcessStarts),
			t.goal(p.ExcessStarts <= 0, "never over")+"; a start may come up to MaxLateness (and the reply's trip) after its grant time")
	}
}

func (c *PolicyChange) gobench(g *gobench) {
	g.line("PolicyChange", c.Grants, c.Errors, "errors")
	for i, p := range c.Phases {
		g.line(fmt.Sprintf("PolicyChange/phase-%d-%s-per-s", i+1, num(p.perSecond())), p.Judged,
			f(p.Rate), "grants/s", f(p.Utilization), "utilization",
			p.ExcessSlots, "excess-slots", p.ExcessStarts, "excess-starts-slack",
			ms(p.Change), "ms-change", ms(p.ReachMax), "ms-reach")
	}
}

// writePolicyChangePlot draws the policy-change run to path (.svg or
// .png): grants per 100 ms, by grant time and by start time, as a rate,
// against the policy of each phase, with the changes marked.
func writePolicyChangePlot(path string, grants []loadgen.Grant, phases []PolicyChangePhase, changes []changeCall) error {
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
	p.Title.Text = fmt.Sprintf("Grant rate (grants per %v) as SetPolicies changes the policy", bin)
	p.X.Label.Text = "s since the first grant time"
	p.Y.Label.Text = "grants/s"
	p.Legend.Top = true
	// The policy in force: a step at each change (drawn at its return).
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
	if err := addLine(p, lim, colLimit, true, "policy in force", vg.Points(2)); err != nil {
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
