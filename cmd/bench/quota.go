package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"math"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
)

// Quota is a real quota of several policies and a cost per request,
// saturated by callers in several processes: Sentinel Hub's contract
// (1,000 requests a minute, 1,000 processing units a minute, 400,000 a
// month) with time running 1,000 times faster, capacities unchanged. A
// minute lasts 60 ms and the month 44.6 min; each request costs 1 request
// and 1 to 60 PU (30.5 on average), so the PU-per-minute policy binds from
// start to end: the requests policy lets 30 times more requests through,
// and the month's 400,000 PU would last 24 s at the minute's pace, longer
// than the run. The month still takes every cost and is judged like the
// others.
type Quota struct {
	Callers  int           `json:"callers"`
	Procs    int           `json:"procs"`
	Duration time.Duration `json:"duration_ns"`
	CostMin  int           `json:"cost_min"`
	CostMax  int           `json:"cost_max"`
	QuotaFigures

	plot string // --quota-plot: the file to draw
}

// quotaUnit is the unit of the processing-unit policies.
const quotaUnit = "pu"

// quotaPolicies is the contract, time ÷ 1,000, each with the name a user
// knows it by.
func quotaPolicies() []QuotaPolicy {
	return []QuotaPolicy{
		{Name: "requests", Unit: "", Capacity: 1000, RefillAmount: 1, RefillFrequency: 60 * time.Microsecond},
		{Name: "PU per minute", Unit: quotaUnit, Capacity: 1000, RefillAmount: 1, RefillFrequency: 60 * time.Microsecond},
		{Name: "PU per month", Unit: quotaUnit, Capacity: 400_000, RefillAmount: 1, RefillFrequency: 6696 * time.Microsecond},
	}
}

// QuotaPolicy is one policy of the contract and what the run granted in it.
type QuotaPolicy struct {
	Name            string        `json:"name"`
	Unit            string        `json:"unit"` // "" counts requests
	Capacity        int           `json:"capacity"`
	RefillAmount    int           `json:"refill_amount"`
	RefillFrequency time.Duration `json:"refill_frequency_ns"`

	// Units is the sum of the costs granted in the policy's unit.
	Units int `json:"units"`
	// Need is (Units − Capacity) / rate: the least time the policy lets
	// Units be granted in, its full bucket spent at once. The binding
	// policy is the one that needs the longest.
	Need time.Duration `json:"need_ns"`
	// Utilization is Need / Span: the share of the policy's refills over
	// the run that callers used. Because refills are discrete it can
	// exceed 1 by RefillAmount / (Units − Capacity).
	Utilization float64 `json:"utilization"`
	// ExcessSlots is the busiest window of the slots (Redis clock): units
	// granted in it minus what the policy allows there (≤ 0: the promise
	// held). ExcessStarts is the same for the instants Enter returned,
	// each window judged MaxLateness + 2 ms longer, as the bucket promises
	// for starts.
	ExcessSlots  int `json:"excess_slots"`
	ExcessStarts int `json:"excess_starts_slack"`
	// Missed is the units taken for slots their callers never used: lost
	// (the caller queued again at the back) or missed by a caller later
	// than MaxLateness whose tokens did not go back to the bucket.
	Missed int `json:"missed_units"`
}

func (p QuotaPolicy) limit() guarantee.Limit {
	return guarantee.Limit{Capacity: p.Capacity, RefillAmount: p.RefillAmount, RefillFrequency: p.RefillFrequency}
}

func (p QuotaPolicy) perSecond() float64 {
	return float64(p.RefillAmount) / p.RefillFrequency.Seconds()
}

// cost is what grant g took from p.
func (p QuotaPolicy) cost(g loadgen.Grant) int {
	if p.Unit == "" {
		return 1
	}
	return g.Cost
}

// QuotaFigures is the judgement of every grant of a quota run.
type QuotaFigures struct {
	Grants int    `json:"grants"` // successful Enters
	Errors int    `json:"errors"` // failed Enters
	Err    string `json:"first_error,omitempty"`
	// Span is from the first to the last slot (Redis clock).
	Span     time.Duration `json:"span_ns"`
	Policies []QuotaPolicy `json:"policies"`
	// Binding indexes the policy that needed the longest (Policies).
	Binding int `json:"binding"`
	// OvertakenSlot counts grants whose slot some later arrival's slot
	// preceded; OvertakenStart those whose start some later arrival's
	// start preceded by more than StartTol. Both leave out the callers
	// retimed for lateness (Retimes), whose later slots are by design,
	// and those that claimed a slot another did not come for (Claims).
	OvertakenSlot  int           `json:"overtaken_slot"`
	OvertakenStart int           `json:"overtaken_start"`
	StartTol       time.Duration `json:"overtaken_start_tol_ns"`
	// Queued counts grants whose caller waited in the queue;
	// PollsPerQueued is their polls over them.
	Queued         int     `json:"queued"`
	PollsPerQueued float64 `json:"polls_per_queued"`
	MaxPolls       int     `json:"max_polls"`
	// Reentries, Retimes and Refunds sum the grants' Report figures of
	// the same names.
	Reentries int `json:"reentries"`
	Retimes   int `json:"retimes"`
	Refunds   int `json:"refunds"`
	// Wait is how long queued callers waited in Enter.
	Wait        Dist          `json:"wait_queued"`
	MaxLateness time.Duration `json:"max_lateness_ns"`
}

// The goals the run is held to.
const (
	quotaUtilizationGoal = 0.99
	quotaPollsGoal       = 1.05
)

func (*Quota) about() about {
	return about{name: "quota", takes: "~12 s", all: true,
		what: "a contract of three policies (requests, PU a minute, PU a month) and random costs, callers in several processes; every policy judged"}
}

func (q *Quota) flags(fs *flag.FlagSet) {
	fs.IntVar(&q.Callers, "quota-callers", 200, "callers in total, spread over the processes")
	fs.IntVar(&q.Procs, "quota-procs", 4, "worker processes (1: the callers run in this process)")
	fs.DurationVar(&q.Duration, "quota-duration", 10*time.Second, "how long the callers keep entering")
	fs.StringVar(&q.plot, "quota-plot", "", "draw, per policy, the units granted against the allowed envelope to `FILE` (.svg or .png)")
	q.CostMin, q.CostMax = 1, 60
}

func (q *Quota) check() error { return checkLoad("quota-", q.Callers, q.Procs, q.Duration) }

// run has the callers enter with random costs on one bucket of the
// contract's policies for q.Duration, then judges every grant per policy.
func (q *Quota) run(ctx context.Context, e *env) error {
	ps := quotaPolicies()
	cfg := bucket.Config{Name: e.name, Capacity: ps[0].Capacity, RefillAmount: ps[0].RefillAmount, RefillFrequency: ps[0].RefillFrequency}
	for _, p := range ps[1:] {
		cfg.Policies = append(cfg.Policies, bucket.Policy{Unit: p.Unit, Capacity: p.Capacity, RefillAmount: p.RefillAmount, RefillFrequency: p.RefillFrequency})
	}
	// Once queued, a caller waits for the others' costs ahead of it at the
	// binding rate; wait much longer before giving up on a stuck Enter.
	mean := float64(q.CostMin+q.CostMax) / 2
	turn := time.Duration(float64(q.Callers) * mean / ps[1].perSecond() * float64(time.Second))
	e.logf("quota: %d callers in %d process(es) for %v, costs %d–%d PU, on requests, PU a minute and PU a month...",
		q.Callers, q.Procs, q.Duration, q.CostMin, q.CostMax)
	specs := make([]loadgen.Spec, q.Procs)
	for i := range specs {
		specs[i] = loadgen.Spec{Proc: i, Addr: e.opt.Addr, URL: e.url, Bucket: cfg, Callers: share(q.Callers, q.Procs, i),
			Until: q.Duration, Timeout: 30*time.Second + 4*turn, CostUnit: quotaUnit, CostMin: q.CostMin, CostMax: q.CostMax}
	}
	var (
		grants []loadgen.Grant
		err    error
	)
	if q.Procs == 1 {
		grants, _, err = inProcess(ctx, e.opt, specs[0])
	} else {
		grants, _, err = inWorkers(ctx, specs, e.log)
	}
	if err != nil {
		return err
	}
	q.QuotaFigures = judgeQuota(grants, ps, cmp.Or(cfg.MaxLateness, defaultMaxLateness))
	if q.plot != "" {
		if err := writeQuotaPlot(q.plot, grants, q.Policies); err != nil {
			return err
		}
		e.logf("quota: plot written to %s", q.plot)
	}
	return nil
}

// judgeQuota judges every grant of a quota run against each policy of ps;
// maxLate is the bucket's MaxLateness.
func judgeQuota(grants []loadgen.Grant, ps []QuotaPolicy, maxLate time.Duration) QuotaFigures {
	const startTol = time.Millisecond
	qf := QuotaFigures{StartTol: startTol, MaxLateness: maxLate}
	var (
		slots []time.Time
		waits []time.Duration
		polls int
	)
	ps = append([]QuotaPolicy(nil), ps...)
	bySlot := make([][]guarantee.Grant, len(ps))
	byStart := make([][]guarantee.Grant, len(ps))
	for _, g := range grants {
		if !g.OK() {
			qf.Errors++
			if qf.Err == "" {
				qf.Err = g.Err
			}
			continue
		}
		qf.Grants++
		slots = append(slots, g.SlotTime())
		for i, p := range ps {
			c := p.cost(g)
			ps[i].Units += c
			ps[i].Missed += (g.Reentries + g.Retimes - g.Refunds) * c
			bySlot[i] = append(bySlot[i], guarantee.Grant{At: g.SlotTime(), Cost: c})
			byStart[i] = append(byStart[i], guarantee.Grant{At: g.Time(), Cost: c})
		}
		qf.Reentries += g.Reentries
		qf.Retimes += g.Retimes
		qf.Refunds += g.Refunds
		if g.Polls > 0 || g.Position > 0 {
			qf.Queued++
			polls += g.Polls
			qf.MaxPolls = max(qf.MaxPolls, g.Polls)
			waits = append(waits, g.Wait())
		}
	}
	if len(slots) > 1 {
		first, last := slots[0], slots[0]
		for _, s := range slots {
			first, last = minTime(first, s), maxTime(last, s)
		}
		qf.Span = last.Sub(first)
	}
	qf.Binding = 0
	for i := range ps {
		p := &ps[i]
		p.Need = time.Duration(float64(p.Units-p.Capacity) / p.perSecond() * float64(time.Second))
		if qf.Span > 0 {
			p.Utilization = math.Max(0, float64(p.Need)/float64(qf.Span))
		}
		p.ExcessSlots = guarantee.CheckCosts(bySlot[i], p.limit(), 0).Excess
		p.ExcessStarts = guarantee.CheckCosts(byStart[i], p.limit(), maxLate+startSlack).Excess
		if p.Need > ps[qf.Binding].Need {
			qf.Binding = i
		}
	}
	qf.Policies = ps
	qf.OvertakenSlot, qf.OvertakenStart = overtakenInOrder(grants, startTol)
	qf.PollsPerQueued = per(int64(polls), qf.Queued)
	qf.Wait = distOf(waits)
	return qf
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

func (q *Quota) table(t *table, _ Limit) {
	t.title("QUOTA: Sentinel Hub's contract with time 1,000× faster; %d callers in %d process(es) enter for %v, each request costing 1 request and %d–%d PU",
		q.Callers, q.Procs, q.Duration, q.CostMin, q.CostMax)
	note := fmt.Sprintf("%d errors", q.Errors)
	if q.Err != "" {
		note += "; first: " + q.Err
	}
	t.row("grants", commas(q.Grants), note)
	t.row("from the first grant time to the last", dur(q.Span), "")
	for i, p := range q.Policies {
		role := "not binding"
		if i == q.Binding {
			role = "binding"
		}
		t.row(p.Name+", "+role, "", fmt.Sprintf("capacity %s, %d every %v = %s/s", commas(p.Capacity), p.RefillAmount, p.RefillFrequency, num(p.perSecond())))
		unit := "requests"
		if p.Unit != "" {
			unit = "PU"
		}
		t.row("  granted", commas(p.Units)+" "+unit, fmt.Sprintf("%s more spent on grant times their callers lost or came too late for (tokens not given back)", commas(p.Missed)))
		switch {
		case i == q.Binding:
			t.row("  utilization after the initial burst", fmt.Sprintf("%.4f", p.Utilization),
				fmt.Sprintf("%s; (granted − capacity) / refills from the first grant time to the last", t.goal(p.Utilization >= quotaUtilizationGoal, fmt.Sprintf("≥ %.2f", quotaUtilizationGoal))))
		case p.Units <= p.Capacity:
			t.row("  utilization after the initial burst", "–", fmt.Sprintf("never emptied: its capacity alone covers what was granted (%.0f %% of it)", 100*float64(p.Units)/float64(p.Capacity)))
		default:
			t.row("  utilization after the initial burst", fmt.Sprintf("%.4f", p.Utilization), "no goal: the binding policy held callers back first")
		}
		t.row("  busiest window, grant times", vsLimit(p.ExcessSlots), t.goal(p.ExcessSlots <= 0, "never over"))
		t.row(fmt.Sprintf("  busiest window, start times, windows %s longer", dur(q.MaxLateness+startSlack)), vsLimit(p.ExcessStarts),
			t.goal(p.ExcessStarts <= 0, "never over")+"; a start may come up to MaxLateness (and the reply's trip) after its grant time")
	}
	t.row("grants overtaken, by grant time", pct(q.OvertakenSlot, q.Grants),
		fmt.Sprintf("%s; %d callers granted later than one that reached Redis after them, whatever the costs (callers late for their grant times, retimed, left out)", t.goal(q.OvertakenSlot == 0, "0 %"), q.OvertakenSlot))
	t.row("grants overtaken, by start time", pct(q.OvertakenStart, q.Grants),
		fmt.Sprintf("no goal: %d callers that one reaching Redis after them started > %s before, which the processes' scheduling adds", q.OvertakenStart, dur(q.StartTol)))
	t.row("polls per queued caller", fmt.Sprintf("%.3f", q.PollsPerQueued),
		fmt.Sprintf("%s; times a queued caller asked Redis for its grant time; %s queued grants, max %d polls", t.goal(q.PollsPerQueued <= quotaPollsGoal, fmt.Sprintf("≤ %.2f", quotaPollsGoal)), commas(q.Queued), q.MaxPolls))
	t.row("late callers (retimes)", commas(q.Retimes),
		fmt.Sprintf("came > MaxLateness (%s) after their grant time; %s started at once with the missed grant's cost, still unused in the bucket, the others took the next grant time, ahead of the queue", dur(q.MaxLateness), commas(q.Refunds)))
	t.row("queued again at the back (re-entries)", commas(q.Reentries), "lost their grant time (e.g. Redis restarted) or met a change of the policies (SetPolicies): their cost is spent")
	t.row("wait of queued callers, p50 / p99 / max", fmt.Sprintf("%s / %s / %s", dur(q.Wait.P50), dur(q.Wait.P99), dur(q.Wait.Max)), "")
}

func (q *Quota) gobench(g *gobench) {
	b := q.Policies[q.Binding]
	g.line("Quota", q.Grants,
		f(b.Utilization), "utilization",
		f(100*per(int64(q.OvertakenSlot), q.Grants)), "pct-overtaken-slot",
		f(q.PollsPerQueued), "polls/waiter",
		q.Reentries, "reentries",
		q.Retimes, "retimes",
		q.Errors, "errors")
	for _, p := range q.Policies {
		g.line("Quota/"+slug(p.Name), p.Units, p.ExcessSlots, "excess-slots", p.ExcessStarts, "excess-starts-slack", f(p.Utilization), "utilization")
	}
}

// slug is name in lower case with dashes for spaces, for a benchmark name.
func slug(name string) string {
	out := []byte(name)
	for i, c := range out {
		switch {
		case c == ' ':
			out[i] = '-'
		case 'A' <= c && c <= 'Z':
			out[i] = c + 'a' - 'A'
		}
	}
	return string(out)
}
