// Package lanelabel bounds the lane labels of a limiter's metrics
// (bucket.WithLane): a bucket may serve thousands of lanes (one per
// tenant), and a label value per lane would make as many series. Each
// limiter labels at most its top lanes by their own name, the lanes with
// the most calls lately, and every other lane Other. The default lane's
// label is "" (no label in PromQL; no attribute through OpenTelemetry),
// so that a bucket without lanes has the series it had before lanes.
//
// The adapters (metrics/sluiceotel, metrics/sluiceprometheus) label with
// it, so that one dashboard reads either one's metrics; an Observer of
// your own can too.
package lanelabel

import "time"

const (
	// DefaultTop is how many lanes of a limiter get a label of their
	// own unless the adapter's WithTopLanes says otherwise.
	DefaultTop = 20
	// Other is the label of the lanes past the top ones. A lane named
	// "other" counts with them.
	Other = "other"
	// laneWindow is how long the calls counted to rank the lanes last:
	// the ranking counts the calls of the current window and the one
	// before, one to two windows' worth.
	laneWindow = time.Minute
	// laneCounted bounds the lanes counted in a window; one past it is
	// labelled "other" unless a label is free.
	laneCounted = 10_000
)

// Ranks decides which lanes of one limiter have a label of their
// own: while fewer than max have one, every new lane gets one; after
// that, a lane takes the label of the labelled lane with the fewest
// calls lately once it has seen more than twice as many. Twice, so that
// lanes of equal traffic do not trade labels back and forth: each trade
// ends a series and starts another. A Ranks is not safe for
// concurrent use: its owner locks it.
type Ranks struct {
	max       int
	since     time.Time        // the start of the current window
	cur, prev map[string]int64 // calls per lane, in the current window and the one before
	own       map[string]bool  // the lanes with a label of their own
}

func New(max int) *Ranks {
	return &Ranks{max: max, cur: map[string]int64{}, own: map[string]bool{}}
}

// Label counts a call in lane (not the default lane) at now, and returns
// its label, and the lane whose label it took ("" if none): its series
// are to be deleted.
func (r *Ranks) Label(lane string, now time.Time) (label, evicted string) {
	if lane == Other || r.max <= 0 {
		return Other, ""
	}
	switch {
	case now.Sub(r.since) >= 2*laneWindow:
		r.prev, r.cur, r.since = nil, map[string]int64{}, now
	case now.Sub(r.since) >= laneWindow:
		r.prev, r.cur, r.since = r.cur, map[string]int64{}, now
	}
	if _, ok := r.cur[lane]; ok || len(r.cur) < laneCounted {
		r.cur[lane]++
	}
	if r.own[lane] {
		return lane, ""
	}
	if len(r.own) < r.max {
		r.own[lane] = true
		return lane, ""
	}
	least, fewest := "", int64(-1)
	for l := range r.own {
		if n := r.calls(l); fewest < 0 || n < fewest || (n == fewest && l > least) {
			least, fewest = l, n
		}
	}
	if r.calls(lane) <= 2*fewest {
		return Other, ""
	}
	delete(r.own, least)
	r.own[lane] = true
	return lane, least
}

// calls is lane's calls lately: in the current window and the one
// before.
func (r *Ranks) calls(lane string) int64 {
	return r.cur[lane] + r.prev[lane]
}
