package main

import (
	"slices"
	"time"

	"github.com/sluicehq/sluice/internal/testing/guarantee"
)

// fifoGrants is when a perfect FIFO queue in front of a token bucket of l
// grants each caller of arrivals: the yardstick the tenants and churn
// scenarios hold the bucket to. The bucket is full at the first arrival
// and gains l.RefillAmount tokens every l.RefillFrequency from then on;
// each caller, in order of arrival, takes one token as soon as it has
// arrived, every caller ahead of it has been granted and a token is there.
// The result is parallel to arrivals, which need not be sorted.
func fifoGrants(arrivals []time.Time, l guarantee.Limit) []time.Time {
	grants := make([]time.Time, len(arrivals))
	if len(arrivals) == 0 {
		return grants
	}
	order := make([]int, len(arrivals))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return arrivals[a].Compare(arrivals[b]) })
	t0 := arrivals[order[0]]
	tokens, tick := l.Capacity, int64(0) // tokens after the refill of tick
	refill := func(k int64) {            // up to the refill of tick k
		if k > tick {
			tokens = int(min(int64(l.Capacity), int64(tokens)+(k-tick)*int64(l.RefillAmount)))
			tick = k
		}
	}
	at := t0
	for _, i := range order {
		at = later(at, arrivals[i])
		refill(int64(at.Sub(t0) / l.RefillFrequency))
		if tokens < 1 {
			refill(tick + 1)
			at = t0.Add(time.Duration(tick) * l.RefillFrequency)
		}
		tokens--
		grants[i] = at
	}
	return grants
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
