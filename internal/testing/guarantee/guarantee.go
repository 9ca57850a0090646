// Package guarantee checks grants against the token bucket's promise,
// per policy: in any window of length T, the costs granted sum to at most
// Capacity + RefillAmount × (⌊T / RefillFrequency⌋ + 1). Check and
// CheckSlack take timestamps that each count 1; CheckCosts takes grants
// with their cost in the policy's unit. Brute and BruteCosts are the same
// by definition, in O(n²), for tests.
//
// Every Redis-backed test and cmd/bench run it over all their grants.
package guarantee

import (
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/sluicehq/sluice/internal/protocol"
)

// Limit is one policy's promise. Kind makes it a window of length
// RefillFrequency: at most Capacity in any closed window of that length
// (protocol.Rolling), or in each window [Offset + k·RefillFrequency,
// Offset + (k+1)·RefillFrequency) of the Unix clock (protocol.Fixed); a
// token bucket's promise (Allowed) holds for a fixed window too.
type Limit struct {
	Capacity        int
	RefillAmount    int
	RefillFrequency time.Duration
	Kind            protocol.Kind
	Offset          time.Duration
}

// Allowed is the most units (grants, when each counts 1) the limit
// permits in a window of length d.
func (l Limit) Allowed(d time.Duration) int {
	return l.Capacity + l.RefillAmount*(int(d/l.RefillFrequency)+1)
}

// Grant is one grant of a cost: Cost units of a policy's unit taken at
// At. A cost of 0 takes nothing from the policy and counts nothing.
type Grant struct {
	At   time.Time
	Cost int
}

// Result is the worst window found.
type Result struct {
	// Grants is how many grants were judged (those of cost 0 included);
	// Units is the sum of their costs (Grants when each counts 1).
	Grants, Units int
	// Excess is the largest (units in window - Allowed(window)); ≤ 0
	// means the promise holds. With no units granted it is 0.
	Excess int
	// From and To bound the worst window (first and last grant in it);
	// Count is the grants of non-zero cost in it, InWindow their units.
	From, To time.Time
	Count    int
	InWindow int
}

// OK reports whether the promise held.
func (r Result) OK() bool { return r.Excess <= 0 }

func (r Result) String() string {
	if r.Units == r.Grants && r.InWindow == r.Count {
		return fmt.Sprintf("%d grants, worst window %d grants in %v (excess %d)", r.Grants, r.Count, r.To.Sub(r.From), r.Excess)
	}
	return fmt.Sprintf("%d grants of %d units, worst window %d units (%d grants) in %v (excess %d)",
		r.Grants, r.Units, r.InWindow, r.Count, r.To.Sub(r.From), r.Excess)
}

// Check returns the worst window of grants against l, in O(n log n).
func Check(grants []time.Time, l Limit) Result { return CheckSlack(grants, l, 0) }

// CheckSlack is Check with every window judged as if slack longer: the
// promise for start times that may each lag their slot by up to slack.
func CheckSlack(grants []time.Time, l Limit, slack time.Duration) Result {
	return CheckCosts(ones(grants), l, slack)
}

// ones is grants at ts of cost 1 each.
func ones(ts []time.Time) []Grant {
	gs := make([]Grant, len(ts))
	for i, t := range ts {
		gs[i] = Grant{At: t, Cost: 1}
	}
	return gs
}

// sorted returns the grants of non-zero cost in time order, and the
// count and units of all; it panics on a negative cost, which no bucket
// grants, unless charges (CheckCharges): then, at equal times, the
// negative ones come first.
func sorted(grants []Grant, charges bool) (gs []Grant, res Result) {
	res.Grants = len(grants)
	for _, g := range grants {
		switch {
		case g.Cost < 0 && !charges:
			panic(fmt.Sprintf("guarantee: negative cost %d at %v", g.Cost, g.At))
		case g.Cost != 0:
			gs = append(gs, g)
			res.Units += g.Cost
		}
	}
	slices.SortStableFunc(gs, func(a, b Grant) int {
		if c := a.At.Compare(b.At); c != 0 {
			return c
		}
		return min(a.Cost, 0) - min(b.Cost, 0) // negative ones first: only charges have any
	})
	return gs, res
}

// CheckCharges is CheckCosts over charges that may be negative: a
// reservation's estimate at its grant, then at its settle the rest given
// back (negative) or the debt taken (positive). A window counts the sum
// of the charges in it. A window that begins between charges of the same
// instant counts only those after it: with the negative ones first, such
// a window is judged more strictly than the whole instant, never less.
func CheckCharges(charges []Grant, l Limit, slack time.Duration) Result {
	gs, res := sorted(charges, true)
	return checkCosts(gs, res, l, slack)
}

// CheckCosts returns the worst window of grants against l, each grant
// counting its cost, with every window judged as if slack longer (0 for
// the promise itself), in O(n log n). A cost must not be negative.
//
// With the grants of non-zero cost sorted and measured from the first,
// F = RefillFrequency, A = RefillAmount and C = Capacity, write
// t = q·F + r (and t+slack = q'·F + r' for the end of a window), and let
// P_i be the sum of the costs before grant i. Then
// ⌊(t_j + slack − t_i)/F⌋ = q'_j − q_i − [r'_j < r_i], so the excess
// of the window from grant i to grant j is
//
//	(P_{j+1} − A·q'_j) − (P_i − A·q_i) − C − A + A·[r'_j < r_i],
//
// and for each j it is enough to know the largest A·q_i − P_i over i ≤ j,
// overall and among those with r_i > r'_j: a running maximum and a
// Fenwick tree over the ranks of r. (Grants of equal time may split a
// window only where the whole group of them gives a larger sum, so the
// best window holds whole groups.)
func CheckCosts(grants []Grant, l Limit, slack time.Duration) Result {
	gs, res := sorted(grants, false)
	switch l.Kind {
	case protocol.Rolling:
		return checkRolling(gs, res, l, slack)
	case protocol.Fixed:
		if r := checkFixed(gs, res, l, slack); !r.OK() {
			return r
		}
	}
	return checkCosts(gs, res, l, slack)
}

// checkRolling is CheckCosts for a rolling window: the most units in any
// closed window of length RefillFrequency less slack (starts that lag
// their slots by up to slack and lie within that of each other have
// slots within a window), against Capacity, in O(n).
func checkRolling(gs []Grant, res Result, l Limit, slack time.Duration) Result {
	w := l.RefillFrequency - slack
	worst, sum, i := -1<<62, 0, 0
	for j, g := range gs {
		sum += g.Cost
		for g.At.Sub(gs[i].At) > w {
			sum -= gs[i].Cost
			i++
		}
		if j+1 < len(gs) && gs[j+1].At.Equal(g.At) {
			continue // the window ends with all grants of that instant
		}
		if e := sum - l.Capacity; e > worst {
			worst = e
			res.From, res.To, res.Count, res.InWindow = gs[i].At, g.At, j-i+1, sum
		}
	}
	if len(gs) > 0 {
		res.Excess = worst
	}
	return res
}

// checkFixed judges each fixed window on its own: the units of its
// grants against Capacity; with slack, a window counts only the grants
// from slack after its start (their slots surely lie in it).
func checkFixed(gs []Grant, res Result, l Limit, slack time.Duration) Result {
	w := int64(l.RefillFrequency)
	off := int64(l.Offset)
	index := func(t time.Time) int64 {
		d := t.UnixNano() - off
		k := d / w
		if d < 0 && d%w != 0 {
			k--
		}
		return k
	}
	worst := -1 << 62
	for i := 0; i < len(gs); {
		k := index(gs[i].At)
		from, end := time.Unix(0, off+k*w).Add(slack), time.Unix(0, off+(k+1)*w)
		sum, j := 0, i
		for ; j < len(gs) && gs[j].At.Before(end); j++ {
			if !gs[j].At.Before(from) {
				sum += gs[j].Cost
			}
		}
		if e := sum - l.Capacity; e > worst {
			worst = e
			res.From, res.To, res.Count, res.InWindow = gs[i].At, gs[j-1].At, j-i, sum
		}
		for i < len(gs) && index(gs[i].At) == k {
			i++
		}
	}
	if len(gs) > 0 {
		res.Excess = worst
	}
	return res
}

// checkCosts is CheckCosts over grants sorted (by sorted).
func checkCosts(gs []Grant, res Result, l Limit, slack time.Duration) Result {
	n := len(gs)
	if n == 0 {
		return res
	}
	f := int64(l.RefillFrequency)
	a := int64(l.RefillAmount)
	q := make([]int64, n)
	r := make([]int64, n)
	prefix := make([]int64, n+1) // prefix[i]: the costs of grants before i
	for i, g := range gs {
		d := int64(g.At.Sub(gs[0].At))
		q[i], r[i] = d/f, d%f
		prefix[i+1] = prefix[i] + int64(g.Cost)
	}
	// Ranks of r, largest first, so "r_i > x" is a prefix of ranks.
	rs := slices.Clone(r)
	slices.Sort(rs)
	rs = slices.Compact(rs)
	rank := func(x int64) int { // of a value in rs: 1 for the largest
		return len(rs) - sort.Search(len(rs), func(k int) bool { return rs[k] >= x })
	}
	above := func(x int64) int { // how many values in rs exceed x
		return len(rs) - sort.Search(len(rs), func(k int) bool { return rs[k] > x })
	}
	type best struct {
		v int64
		i int
	}
	none := best{v: -1 << 62, i: -1}
	tree := make([]best, len(rs)+1)
	for k := range tree {
		tree[k] = none
	}
	update := func(k int, b best) {
		for ; k < len(tree); k += k & -k {
			if b.v > tree[k].v {
				tree[k] = b
			}
		}
	}
	query := func(k int) best { // max over ranks 1..k
		m := none
		for ; k > 0; k -= k & -k {
			if tree[k].v > m.v {
				m = tree[k]
			}
		}
		return m
	}
	overall := none
	worst := int64(-1 << 62)
	for j := 0; j < n; j++ {
		v := a*q[j] - prefix[j]
		if v > overall.v {
			overall = best{v, j}
		}
		update(rank(r[j]), best{v, j})
		end := int64(gs[j].At.Sub(gs[0].At)) + int64(slack)
		qe, re := end/f, end%f
		base := prefix[j+1] - a*qe - int64(l.Capacity) - a
		cand, bonus := overall, int64(0)
		if s := query(above(re)); s.i >= 0 && s.v+a > cand.v {
			cand, bonus = s, a
		}
		if e := base + cand.v + bonus; e > worst {
			worst = e
			res.From, res.To = gs[cand.i].At, gs[j].At
			res.Count, res.InWindow = j-cand.i+1, int(prefix[j+1]-prefix[cand.i])
		}
	}
	res.Excess = int(worst)
	return res
}

// Brute is CheckSlack by trying every window, in O(n²): the reference the
// fast version is tested against.
func Brute(grants []time.Time, l Limit, slack time.Duration) Result {
	return BruteCosts(ones(grants), l, slack)
}

// BruteCosts is CheckCosts by its definition, in O(n²): for every pair of
// instants at which grants were made, the costs of all grants from the
// one to the other (cost 0 included, counting nothing) against what l
// allows in that window, slack longer.
func BruteCosts(grants []Grant, l Limit, slack time.Duration) Result {
	return bruteCosts(grants, l, slack, false)
}

// BruteCharges is CheckCharges by its definition, in O(n²), over windows
// of whole instants.
func BruteCharges(charges []Grant, l Limit, slack time.Duration) Result {
	return bruteCosts(charges, l, slack, true)
}

func bruteCosts(grants []Grant, l Limit, slack time.Duration, charges bool) Result {
	res := Result{Grants: len(grants)}
	gs := slices.Clone(grants)
	slices.SortStableFunc(gs, func(a, b Grant) int { return a.At.Compare(b.At) })
	some := false
	for _, g := range gs {
		if g.Cost < 0 && !charges {
			panic(fmt.Sprintf("guarantee: negative cost %d at %v", g.Cost, g.At))
		}
		res.Units += g.Cost
		some = some || g.Cost != 0
	}
	if !some {
		return res
	}
	res.Excess = -1 << 62
	for i := range gs {
		if i > 0 && gs[i-1].At.Equal(gs[i].At) {
			continue // the window begins with all grants at this instant
		}
		units, count := 0, 0
		for j := i; j < len(gs); j++ {
			units += gs[j].Cost
			if gs[j].Cost > 0 {
				count++
			}
			if j+1 < len(gs) && gs[j+1].At.Equal(gs[j].At) {
				continue // and ends with all grants at that one
			}
			if e := units - l.Allowed(gs[j].At.Sub(gs[i].At)+slack); e > res.Excess {
				res.Excess, res.From, res.To, res.Count, res.InWindow = e, gs[i].At, gs[j].At, count, units
			}
		}
	}
	return res
}
