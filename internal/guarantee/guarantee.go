// Package guarantee checks grant timestamps against the token bucket's
// promise: in any window of length T, at most
// Capacity + Amount × (⌊T / Every⌋ + 1) grants.
//
// Every Redis-backed test and cmd/bench run it over all their grants.
package guarantee

import (
	"fmt"
	"slices"
	"sort"
	"time"
)

// Limit is one policy's promise.
type Limit struct {
	Capacity int
	Amount   int
	Every    time.Duration
}

// Allowed is the most grants the limit permits in a window of length d.
func (l Limit) Allowed(d time.Duration) int {
	return l.Capacity + l.Amount*(int(d/l.Every)+1)
}

// Result is the worst window found.
type Result struct {
	Grants int
	// Excess is the largest (grants in window - Allowed(window)); ≤ 0
	// means the promise holds. With no grants it is 0.
	Excess int
	// From and To bound the worst window (first and last grant in it);
	// Count is the grants in it.
	From, To time.Time
	Count    int
}

// OK reports whether the promise held.
func (r Result) OK() bool { return r.Excess <= 0 }

func (r Result) String() string {
	return fmt.Sprintf("%d grants, worst window %d grants in %v (excess %d)", r.Grants, r.Count, r.To.Sub(r.From), r.Excess)
}

// Check returns the worst window of grants against l, in O(n log n).
func Check(grants []time.Time, l Limit) Result { return CheckSlack(grants, l, 0) }

// CheckSlack is Check with every window judged as if slack longer: the
// promise for start times that may each lag their slot by up to slack.
//
// With times sorted and measured from the first, write t = q·Every + r
// (and t+slack = q'·Every + r' for the end of a window). Then
// ⌊(t_j + slack − t_i)/Every⌋ = q'_j − q_i − [r'_j < r_i], so the excess of
// the window from grant i to grant j is
//
//	(j − A·q'_j) − (i − A·q_i) + 1 − C − A + A·[r'_j < r_i],
//
// and for each j it is enough to know the largest A·q_i − i over i ≤ j,
// overall and among those with r_i > r'_j: a running maximum and a
// Fenwick tree over the ranks of r.
func CheckSlack(grants []time.Time, l Limit, slack time.Duration) Result {
	n := len(grants)
	res := Result{Grants: n}
	if n == 0 {
		return res
	}
	ts := slices.Clone(grants)
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	f := int64(l.Every)
	a := int64(l.Amount)
	q := make([]int64, n)
	r := make([]int64, n)
	for i, t := range ts {
		d := int64(t.Sub(ts[0]))
		q[i], r[i] = d/f, d%f
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
	res.Excess = -1 << 62
	for j := 0; j < n; j++ {
		v := a*q[j] - int64(j)
		if v > overall.v {
			overall = best{v, j}
		}
		update(rank(r[j]), best{v, j})
		end := int64(ts[j].Sub(ts[0])) + int64(slack)
		qe, re := end/f, end%f
		base := int64(j) - a*qe + 1 - int64(l.Capacity) - a
		cand, bonus := overall, int64(0)
		if s := query(above(re)); s.i >= 0 && s.v+a > cand.v {
			cand, bonus = s, a
		}
		if e := base + cand.v + bonus; e > int64(res.Excess) {
			res.Excess = int(e)
			res.From, res.To, res.Count = ts[cand.i], ts[j], j-cand.i+1
		}
	}
	return res
}

// Brute is CheckSlack by trying every window, in O(n²): the reference the
// fast version is tested against.
func Brute(grants []time.Time, l Limit, slack time.Duration) Result {
	ts := slices.Clone(grants)
	slices.SortFunc(ts, func(a, b time.Time) int { return a.Compare(b) })
	res := Result{Grants: len(ts)}
	if len(ts) == 0 {
		return res
	}
	res.Excess = -1 << 62
	for i := range ts {
		for j := i; j < len(ts); j++ {
			if e := (j - i + 1) - l.Allowed(ts[j].Sub(ts[i])+slack); e > res.Excess {
				res.Excess, res.From, res.To, res.Count = e, ts[i], ts[j], j-i+1
			}
		}
	}
	return res
}
