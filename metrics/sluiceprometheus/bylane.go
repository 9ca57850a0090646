package sluiceprometheus

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/metrics/lanelabel"
)

// The metrics of the named lanes: each limiter's lanes are labelled apart
// as lanelabel ranks them.

type limiterKey struct{ kind, name string }

// limiterLanes are the named lanes of one limiter: which ones have a
// label of their own, and the metrics of each kind of event in them.
type limiterLanes struct {
	mu       sync.Mutex
	ranks    *lanelabel.Ranks
	children map[eventKey]*children
}

// laneChild is the metrics of the events of k in named lane lane, under
// the lane's label; it deletes the series of a lane that lost its label.
func (c *Collector) laneChild(k eventKey, lane string) *children {
	v, ok := c.lanes.Load(limiterKey{k.kind, k.name})
	if !ok {
		v, _ = c.lanes.LoadOrStore(limiterKey{k.kind, k.name}, &limiterLanes{ranks: lanelabel.New(c.topLanes), children: map[eventKey]*children{}})
	}
	l := v.(*limiterLanes)
	l.mu.Lock()
	defer l.mu.Unlock()
	var evicted string
	k.lane, evicted = l.ranks.Label(lane, time.Now())
	if evicted != "" {
		for ek := range l.children {
			if ek.lane == evicted {
				delete(l.children, ek)
			}
		}
		match := prometheus.Labels{"sluice_limiter_kind": k.kind, "sluice_limiter_name": k.name, "sluice_lane": evicted}
		c.requests.DeletePartialMatch(match)
		c.inQueue.DeletePartialMatch(match)
	}
	ch, ok := l.children[k]
	if !ok {
		ch = c.newChildren(k)
		l.children[k] = ch
	}
	return ch
}

// collectLanes sends the lanes of in: the default lane's and the top
// lanes' callers and waits under their own labels, the rest's callers
// under "other".
func (c *Collector) collectLanes(ch chan<- prometheus.Metric, name string, in bucket.Inspection) {
	if len(in.Lanes) == 0 {
		return
	}
	other, named := in.OtherQueued, 0
	for _, l := range in.Lanes {
		if l.Name != "" && (named >= c.topLanes || l.Name == lanelabel.Other) {
			other += l.Queued
			continue
		}
		if l.Name != "" {
			named++
		}
		ch <- prometheus.MustNewConstMetric(c.bLaneQueued, prometheus.GaugeValue, float64(l.Queued), "bucket", name, l.Name)
		ch <- prometheus.MustNewConstMetric(c.bLaneWait, prometheus.GaugeValue, l.Wait.Seconds(), "bucket", name, l.Name)
	}
	if other > 0 {
		ch <- prometheus.MustNewConstMetric(c.bLaneQueued, prometheus.GaugeValue, float64(other), "bucket", name, lanelabel.Other)
	}
}
