package main

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
)

// Dist summarises a sample of durations. Percentiles are nearest-rank: the
// p-th percentile is the smallest value with at least p% of the sample at
// or below it.
type Dist struct {
	N   int           `json:"n"`
	P50 time.Duration `json:"p50_ns"`
	P99 time.Duration `json:"p99_ns"`
	Max time.Duration `json:"max_ns"`
}

func distOf(ds []time.Duration) Dist {
	if len(ds) == 0 {
		return Dist{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return Dist{N: len(s), P50: percentile(s, 50), P99: percentile(s, 99), Max: s[len(s)-1]}
}

// percentile of an ascending sample, nearest-rank; 0 for an empty one.
func percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	k := int(math.Ceil(p / 100 * float64(len(sorted))))
	return sorted[min(max(k, 1), len(sorted))-1]
}

// overtakenInOrder counts, among the successful grants not retimed and
// not claimed, those some later ticket's slot preceded (bySlot, no
// tolerance) and those some later ticket's start preceded by more than
// startTol (byStart). A retimed caller missed its slot (it came back
// later than MaxLateness, or did not come for it and a running caller
// claimed it) and took a later one by design: retimes are counted on
// their own; so is a caller that claimed a slot another did not come
// for, ahead of the callers between, by design too.
func overtakenInOrder(grants []loadgen.Grant, startTol time.Duration) (bySlot, byStart int) {
	var tickets []int64
	var slots, starts []time.Time
	for _, g := range grants {
		if g.OK() && g.Retimes == 0 && g.Claims == 0 {
			tickets = append(tickets, g.Ticket)
			slots, starts = append(slots, g.SlotTime()), append(starts, g.Time())
		}
	}
	return overtaken(tickets, slots, 0), overtaken(tickets, starts, startTol)
}

// overtaken counts the grants that some grant with a later ticket (a caller
// that arrived at Redis later) preceded by more than tol. Each grant counts
// once however many overtook it. tickets and at are parallel.
func overtaken(tickets []int64, at []time.Time, tol time.Duration) int {
	idx := make([]int, len(tickets))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int {
		switch {
		case tickets[a] < tickets[b]:
			return -1
		case tickets[a] > tickets[b]:
			return 1
		}
		return 0
	})
	// Walk from the latest ticket back, keeping the earliest time among
	// strictly later tickets (equal tickets are one group: none overtakes
	// another).
	n := 0
	var earliest time.Time // among tickets after the current group
	seen := false
	for hi := len(idx); hi > 0; {
		lo := hi - 1
		for lo > 0 && tickets[idx[lo-1]] == tickets[idx[hi-1]] {
			lo--
		}
		group := idx[lo:hi]
		if seen {
			for _, i := range group {
				if earliest.Before(at[i].Add(-tol)) {
					n++
				}
			}
		}
		for _, i := range group {
			if !seen || at[i].Before(earliest) {
				earliest, seen = at[i], true
			}
		}
		hi = lo
	}
	return n
}

// Throughput is how fully a saturated bucket was used.
type Throughput struct {
	// Span is from the first to the last slot (Redis clock).
	Span time.Duration `json:"span_ns"`
	// Rate is (grants − Capacity) / Span: the grants the refills paid for,
	// per second. The first Capacity grants are the initial burst of the
	// full bucket and are left out.
	Rate float64 `json:"rate_per_s"`
	// Limit is RefillAmount / RefillFrequency, per second.
	Limit float64 `json:"limit_per_s"`
	// Utilization is Rate / Limit: the share of the refills over Span that
	// callers used. Because refills are discrete it can exceed 1 by up to
	// RefillAmount / (grants − Capacity).
	Utilization float64 `json:"utilization"`
}

func throughput(slots []time.Time, l guarantee.Limit) Throughput {
	t := Throughput{Limit: float64(l.RefillAmount) / l.RefillFrequency.Seconds()}
	if len(slots) < 2 {
		return t
	}
	first, last := slices.MinFunc(slots, time.Time.Compare), slices.MaxFunc(slots, time.Time.Compare)
	t.Span = last.Sub(first)
	paid := len(slots) - l.Capacity
	if t.Span <= 0 || paid <= 0 {
		return t
	}
	t.Rate = float64(paid) / t.Span.Seconds()
	t.Utilization = t.Rate / t.Limit
	return t
}

// maxWindowWork bounds the pairs worstWithin examines, so that a run with
// a huge limit does not stall the report.
const maxWindowWork = 200_000_000

// worstWithin is guarantee.Brute (no slack) restricted to windows whose
// first and last grants are at most w apart. ok is false, and nothing is
// computed, when that would examine more than maxWindowWork pairs.
func worstWithin(times []time.Time, l guarantee.Limit, w time.Duration) (res guarantee.Result, ok bool) {
	ts := slices.Clone(times)
	slices.SortFunc(ts, time.Time.Compare)
	res.Grants = len(ts)
	if len(ts) == 0 {
		return res, true
	}
	work := 0
	for i, j := 0, 0; i < len(ts); i++ {
		for j < len(ts) && ts[j].Sub(ts[i]) <= w {
			j++
		}
		if work += j - i; work > maxWindowWork {
			return guarantee.Result{Grants: len(ts)}, false
		}
	}
	res.Excess = math.MinInt
	for i := range ts {
		for j := i; j < len(ts) && ts[j].Sub(ts[i]) <= w; j++ {
			if e := (j - i + 1) - l.Allowed(ts[j].Sub(ts[i])); e > res.Excess {
				res.Excess, res.From, res.To, res.Count = e, ts[i], ts[j], j-i+1
			}
		}
	}
	return res, true
}

// Excess is the worst window of one series of instants.
type Excess struct {
	All   int           `json:"all"`      // over every window (guarantee.Check)
	Count int           `json:"count"`    // grants in that worst window
	Span  time.Duration `json:"span_ns"`  // its length, first to last grant
	Sec   *int          `json:"le_1s"`    // over windows of at most 1 s; nil if skipped
	Tenth *int          `json:"le_100ms"` // over windows of at most 100 ms; nil if skipped
}

func excessOf(ts []time.Time, l guarantee.Limit) Excess {
	r := guarantee.Check(ts, l)
	e := Excess{All: r.Excess, Count: r.Count, Span: r.To.Sub(r.From)}
	if r, ok := worstWithin(ts, l, time.Second); ok {
		e.Sec = &r.Excess
	}
	if r, ok := worstWithin(ts, l, 100*time.Millisecond); ok {
		e.Tenth = &r.Excess
	}
	return e
}

// Saturation is the analysis of one saturated run.
type Saturation struct {
	Grants int    `json:"grants"` // successful Enters
	Errors int    `json:"errors"` // failed Enters
	Err    string `json:"first_error,omitempty"`

	Throughput Throughput `json:"throughput"`
	// ExcessSlots and ExcessStarts are the worst windows of the slots
	// (Redis clock) and of the start times (when Enter returned, local
	// clock): grants in the window minus what the guarantee allows.
	// ≤ 0 means the promise held.
	ExcessSlots  Excess `json:"excess_slots"`
	ExcessStarts Excess `json:"excess_starts"`
	// ExcessStartsSlack is the worst window of the start times with every
	// window judged MaxLateness + 2 ms longer (guarantee.CheckSlack): the
	// bucket's promise for start times, which may each lag their slot by
	// up to MaxLateness (2 ms: the reply's trip).
	ExcessStartsSlack int `json:"excess_starts_slack"`

	// Queued counts grants whose caller waited in the queue (it polled or
	// had a queue position); Steady those of them whose Enter began after
	// the warm-up (Warmup after the first Enter).
	Queued int           `json:"queued"`
	Warmup time.Duration `json:"warmup_ns"`
	Wait   Dist          `json:"wait_queued_steady"`
	// MaxOverMedian is Wait.Max / Wait.P50.
	MaxOverMedian float64 `json:"wait_max_over_median"`

	// OvertakenSlot counts grants whose slot some later ticket's slot
	// preceded (µs resolution, no tolerance); OvertakenStart those whose
	// start some later ticket's start preceded by more than StartTol.
	// Both leave retimed grants out (their callers missed their slot),
	// and claiming ones (Claims: they took a slot another missed).
	OvertakenSlot  int           `json:"overtaken_slot"`
	OvertakenStart int           `json:"overtaken_start"`
	StartTol       time.Duration `json:"overtaken_start_tol_ns"`

	PollsPerQueued float64 `json:"polls_per_queued"`
	MaxPolls       int     `json:"max_polls"`

	// CallerRoundTrips sums the callers' round trips
	// (enterdetail.Detail.RoundTrips); RoundTrips is what the go-redis
	// hooks of every process counted (callers, scheduler steps, lock
	// calls, script loads). Both are per grant below.
	CallerRoundTrips int64 `json:"caller_round_trips"`
	RoundTrips       int64 `json:"round_trips"`

	// Late is Enter's return minus the slot, over all grants (Redis and
	// this machine share a clock when the server is local); LateSteady
	// over the Enters begun after the warm-up.
	Late       Dist `json:"late"`
	LateSteady Dist `json:"late_steady"`
	// LateAnswer counts the steady-state grants whose reply came at or
	// after the slot (enterdetail.Detail.Margin ≤ 0): late before the
	// final wait, by Redis, the network or the process. LateInTime is
	// LateSteady over the others: what the final wait itself adds.
	LateAnswer int  `json:"late_answer"`
	LateInTime Dist `json:"late_in_time"`
	// Early counts grants that returned more than 100 µs before their slot.
	Early int `json:"early"`
	// Tardy counts grants that returned more than MaxLateness after their
	// slot: the bucket gives a caller that late the next slot instead,
	// judging lateness on its own conservative terms.
	Tardy       int           `json:"tardy"`
	MaxLateness time.Duration `json:"max_lateness_ns"`

	// Retimes sums Report.Retimes: the times a caller later than
	// MaxLateness took the next slot, ahead of the queue; Refunds how many
	// of those missed slots' tokens went back to the bucket.
	Retimes int `json:"retimes"`
	Refunds int `json:"refunds"`

	// Reentries sums Report.Reentries: the times a caller queued again at
	// the back (its slot lost, or a live change of the policies).
	Reentries      int `json:"reentries"`       // total
	ReenteredCalls int `json:"reentered_calls"` // grants with at least one
}

// limitRows writes the rows that say whether the limit held: for grant
// times, for start times, and for start times in the longer windows the
// bucket promises them.
func (s Saturation) limitRows(row func(name, value, note string)) {
	row("busiest window, grant times (Redis's clock)", vsLimit(s.ExcessSlots.All), "the promise: never over; "+windows(s.ExcessSlots))
	row("busiest window, start times", vsLimit(s.ExcessStarts.All), "no promise alone: a caller may start up to MaxLateness after its grant time; "+windows(s.ExcessStarts))
	row(fmt.Sprintf("busiest window, start times, windows %s longer", dur(s.MaxLateness+startSlack)), vsLimit(s.ExcessStartsSlack),
		fmt.Sprintf("the promise for start times: never over in windows MaxLateness (%s) + %s (the reply's trip) longer", dur(s.MaxLateness), dur(startSlack)))
}

// lateRows writes the rows of the callers that came late or lost their
// place: retimes (and those that started at once) and re-entries.
func (s Saturation) lateRows(row func(name, value, note string)) {
	row("late callers (retimes)", commas(s.Retimes),
		fmt.Sprintf("%.2f a grant; times a caller came > MaxLateness (%s) after its grant time; %s of them started at once with the missed grant's tokens, still unused in the bucket; the others took the next grant time, ahead of the queue, their missed tokens spent (counting them could have broken the limit)",
			per(int64(s.Retimes), s.Grants), dur(s.MaxLateness), commas(s.Refunds)))
	row("queued again at the back (re-entries)", commas(s.Reentries),
		fmt.Sprintf("%s of grants, %s callers at least once: their grant time was lost (e.g. Redis restarted) or the policies changed (SetPolicies) while they waited", pct(s.Reentries, s.Grants), commas(s.ReenteredCalls)))
}

// RoundTripsPerGrant is RoundTrips per successful Enter.
func (s Saturation) RoundTripsPerGrant() float64 { return per(s.RoundTrips, s.Grants) }

// CallerRoundTripsPerGrant is CallerRoundTrips per successful Enter.
func (s Saturation) CallerRoundTripsPerGrant() float64 { return per(s.CallerRoundTrips, s.Grants) }

// per is a / b, or 0 when b is 0.
func per(a int64, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// The bucket's defaults, as its Config documents them.
const (
	defaultMaxLateness = 25 * time.Millisecond
	defaultKeyPrefix   = "sluice"
)

// startSlack is the reply's trip from Redis to the caller allowed on top
// of MaxLateness when start times are judged (as bucket's tests do).
const startSlack = 2 * time.Millisecond

// analyse judges every grant of a saturated run together. warmup is how
// long after the first Enter began waits start to count; maxLate is the
// bucket's MaxLateness; roundTrips is the total the hooks counted.
func analyse(grants []loadgen.Grant, l guarantee.Limit, warmup, maxLate time.Duration, roundTrips int64) Saturation {
	const startTol = time.Millisecond
	s := Saturation{Warmup: warmup, StartTol: startTol, RoundTrips: roundTrips, MaxLateness: maxLate}
	var (
		slots, starts []time.Time
		waits, late   []time.Duration
		lateSteady    []time.Duration
		lateInTime    []time.Duration
		polls         int
		begin         int64 = math.MaxInt64
	)
	for _, g := range grants {
		begin = min(begin, g.Start)
	}
	for _, g := range grants {
		s.CallerRoundTrips += int64(g.RoundTrips)
		if !g.OK() {
			s.Errors++
			if s.Err == "" {
				s.Err = g.Err
			}
			continue
		}
		s.Grants++
		slots = append(slots, g.SlotTime())
		starts = append(starts, g.Time())
		late = append(late, g.Time().Sub(g.SlotTime()))
		steady := g.Start-begin >= int64(warmup)
		if steady {
			lateSteady = append(lateSteady, g.Time().Sub(g.SlotTime()))
			if g.Margin <= 0 && g.Slot != 0 {
				s.LateAnswer++
			} else {
				lateInTime = append(lateInTime, g.Time().Sub(g.SlotTime()))
			}
		}
		if g.Time().Before(g.SlotTime().Add(-100 * time.Microsecond)) {
			s.Early++
		}
		if g.Time().Sub(g.SlotTime()) > maxLate {
			s.Tardy++
		}
		s.Retimes += g.Retimes
		s.Refunds += g.Refunds
		s.Reentries += g.Reentries
		if g.Reentries > 0 {
			s.ReenteredCalls++
		}
		if g.Polls > 0 || g.Position > 0 {
			s.Queued++
			polls += g.Polls
			s.MaxPolls = max(s.MaxPolls, g.Polls)
			if steady {
				waits = append(waits, g.Wait())
			}
		}
	}
	s.Throughput = throughput(slots, l)
	s.ExcessSlots = excessOf(slots, l)
	s.ExcessStarts = excessOf(starts, l)
	s.Wait = distOf(waits)
	if s.Wait.P50 > 0 {
		s.MaxOverMedian = float64(s.Wait.Max) / float64(s.Wait.P50)
	}
	s.OvertakenSlot, s.OvertakenStart = overtakenInOrder(grants, startTol)
	s.PollsPerQueued = per(int64(polls), s.Queued)
	s.Late = distOf(late)
	s.LateSteady = distOf(lateSteady)
	s.LateInTime = distOf(lateInTime)
	s.ExcessStartsSlack = guarantee.CheckSlack(starts, l, maxLate+startSlack).Excess
	return s
}
