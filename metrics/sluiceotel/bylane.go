package sluiceotel

import (
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/metrics/lanelabel"
)

// The metrics of the named lanes: each limiter's lanes are labelled apart
// as lanelabel ranks them.

type limiterKey struct{ kind, name string }

// limiterLanes are the named lanes of one limiter: which ones have a
// label of their own, and the count and options of each kind of event in
// them.
type limiterLanes struct {
	mu    sync.Mutex
	ranks *lanelabel.Ranks
	sets  map[eventKey]*eventAttrs
}

// laneAttrs is the count and options of the events of k in named lane
// lane, under the lane's label; a lane that lost its label is no longer
// reported.
func (o *Observer) laneAttrs(k eventKey, lane string) *eventAttrs {
	v, ok := o.lanes.Load(limiterKey{k.kind, k.name})
	if !ok {
		v, _ = o.lanes.LoadOrStore(limiterKey{k.kind, k.name}, &limiterLanes{ranks: lanelabel.New(o.topLanes), sets: map[eventKey]*eventAttrs{}})
	}
	l := v.(*limiterLanes)
	l.mu.Lock()
	defer l.mu.Unlock()
	var evicted string
	k.lane, evicted = l.ranks.Label(lane, time.Now())
	if evicted != "" {
		for ek := range l.sets {
			if ek.lane == evicted {
				delete(l.sets, ek)
			}
		}
	}
	a, ok := l.sets[k]
	if !ok {
		a = newEventAttrs(k)
		l.sets[k] = a
	}
	return a
}

// observeLanes observes the lanes of in: the default lane's and the top
// lanes' callers and waits under their own labels, the rest's callers
// under "other".
func (o *Observer) observeLanes(ob metric.Observer, name string, in bucket.Inspection) {
	if len(in.Lanes) == 0 {
		return
	}
	kind, bucketName := KindKey.String("bucket"), NameKey.String(name)
	other, named := int64(in.OtherQueued), 0
	for _, l := range in.Lanes {
		if l.Name != "" && (named >= o.topLanes || l.Name == lanelabel.Other) {
			other += int64(l.Queued)
			continue
		}
		set := attribute.NewSet(kind, bucketName)
		if l.Name != "" {
			named++
			set = attribute.NewSet(kind, bucketName, LaneKey.String(l.Name))
		}
		ob.ObserveInt64(o.bLaneQ, int64(l.Queued), metric.WithAttributeSet(set))
		ob.ObserveFloat64(o.bLaneWait, l.Wait.Seconds(), metric.WithAttributeSet(set))
	}
	if other > 0 {
		ob.ObserveInt64(o.bLaneQ, other, metric.WithAttributes(kind, bucketName, LaneKey.String(lanelabel.Other)))
	}
}
