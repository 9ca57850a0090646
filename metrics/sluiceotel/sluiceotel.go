// Package sluiceotel records Sluice's limiters as OpenTelemetry metrics.
//
// It depends on the OpenTelemetry metric API only: the application picks
// the SDK and the exporter. It lives in a module of its own so that a user
// of Sluice who does not import it does not pay for it (as go-redis keeps
// extra/redisotel apart).
//
// Three parts fit together:
//
//   - An Observer, set as a limiter's Config.Observer, records every call
//     to enter as it returns: the requests by result and lane, the time
//     queued callers waited, and how late rate-limited callers started.
//   - Track reads a limiter's Stats (no I/O) at each collection: callers
//     waiting in this process, permits held, the bucket's scheduler steps,
//     re-entries and lost leases.
//   - TrackQueue, opt-in, reads a bucket across every process with
//     bucket.Inspect at each collection: one Redis round trip per
//     collection (two while named lanes have callers).
//
// A bucket's lanes (bucket.WithLane) are the attribute sluice.lane of the
// requests and of the time in queue: absent for the default lane, the
// lane's name for the lanes of a limiter with the most calls lately (at
// most 20, WithTopLanes), "other" for the rest, so that thousands of
// tenants make a few series, not thousands.
//
// The names and attributes follow OpenTelemetry's semantic conventions for
// rate limiting (ASP.NET Core's aspnetcore.rate_limiting.*), under the
// sluice. prefix; docs/observability.md lists every metric.
package sluiceotel

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/metrics/lanelabel"
)

// ScopeName is the instrumentation scope (the Meter's name) of every
// instrument this package makes.
const ScopeName = "github.com/sluicehq/sluice/metrics/sluiceotel"

// Attribute keys. Kind is the limiter's kind as its Events name it
// ("bucket", "semaphore", "local.rate", ...), Name its Config.Name ("" for
// the in-process limiters), Result how a call ended ("granted", "refused",
// "canceled", "failed"), Reason why it was refused or failed
// ("queue_full", "wait_too_long", "redis", ...; absent otherwise), Lane
// the caller's lane (bucket.WithLane: the lane's name, or "other" past
// WithTopLanes; absent for the default lane).
const (
	KindKey   = attribute.Key("sluice.limiter.kind")
	NameKey   = attribute.Key("sluice.limiter.name")
	ResultKey = attribute.Key("sluice.result")
	ReasonKey = attribute.Key("sluice.reason")
	LaneKey   = attribute.Key("sluice.lane")
)

// inspectTimeout bounds TrackQueue's read of Redis during a collection,
// whatever the collection's own deadline: a Redis that does not answer
// must not stall every other metric.
const inspectTimeout = time.Second

// Observer records every call to enter a limiter (it is a sluice.Observer)
// and, through Track and TrackQueue, the figures of the limiters given to
// it. One Observer may serve any number of limiters: each call is recorded
// under its limiter's kind and name. It is safe for concurrent use.
type Observer struct {
	requests  metric.Int64ObservableCounter
	inQueue   metric.Float64Histogram
	lateness  metric.Float64Histogram
	shadow    metric.Float64Histogram
	meter     metric.Meter
	observed  []metric.Observable // the instruments Track reports
	queued    metric.Int64ObservableUpDownCounter
	held      metric.Int64ObservableUpDownCounter
	steps     metric.Int64ObservableCounter
	fenced    metric.Int64ObservableCounter
	errs      metric.Int64ObservableCounter
	reentries metric.Int64ObservableCounter
	leases    metric.Int64ObservableCounter
	bQueued   metric.Int64ObservableGauge
	bWait     metric.Float64ObservableGauge
	bLaneQ    metric.Int64ObservableGauge
	bLaneWait metric.Float64ObservableGauge
	local     metric.Int64ObservableGauge
	localReqs metric.Int64ObservableCounter

	// sets holds each kind of event's count and attribute options in the
	// default lane, so that recording one builds no attribute set: an
	// eventKey holds *eventAttrs. The named lanes' are their limiter's
	// (lanes).
	sets       sync.Map
	shadowSets sync.Map // eventKey → sluice.shadow_wait's options
	topLanes   int
	lanes      sync.Map // limiterKey → *limiterLanes
}

// eventKey is what an event's attributes depend on.
type eventKey struct {
	kind, name, reason string
	result             sluice.Result
	lane               string // the label: "" (the default lane), a lane's name, or "other"
}

// eventAttrs are one kind of event's count and its options for each
// instrument, made once.
type eventAttrs struct {
	// count is sluice.requests for these attributes. Counted here and
	// reported at collection (an observable counter): an atomic add costs
	// a fraction of a synchronous counter's Add, on every call to enter.
	count    atomic.Int64
	requests metric.ObserveOption  // kind, name, result, reason, lane
	inQueue  []metric.RecordOption // kind, name, result, lane
	lateness []metric.RecordOption // kind, name
}

// Option configures an Observer (New).
type Option func(*Observer)

// WithTopLanes labels, for each limiter, at most n lanes by their own
// name: the lanes with the most calls lately (a lane takes the label of
// the least busy labelled lane once it has seen more than twice its calls
// in the last minute or two); the others are labelled "other". The
// default is 20; n ≤ 0 labels every named lane "other". TrackQueue lists
// at most n lanes too (and at most the 20 bucket.Inspect reads).
//
// A lane that loses its label stops being reported in sluice.requests;
// its sluice.request.time_in_queue series, a synchronous histogram, stays
// in a cumulative SDK (bounded by its cardinality limit, 2000 series per
// instrument by default) but no longer grows.
func WithTopLanes(n int) Option {
	return func(o *Observer) { o.topLanes = max(n, 0) }
}

// New makes the instruments on mp's Meter named ScopeName. A nil mp means
// the global MeterProvider (otel.GetMeterProvider). Make one Observer per
// MeterProvider and share it between limiters: two would report the same
// series twice. It fails only when the MeterProvider refuses an
// instrument or a callback.
func New(mp metric.MeterProvider, opts ...Option) (*Observer, error) {
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	m := mp.Meter(ScopeName)
	o := &Observer{meter: m, topLanes: lanelabel.DefaultTop}
	for _, opt := range opts {
		opt(o)
	}
	var errs [17]error
	o.requests, errs[0] = m.Int64ObservableCounter("sluice.requests",
		metric.WithUnit("{request}"),
		metric.WithDescription("Calls that tried to enter a limiter, by result (and reason, when refused or failed) and lane."))
	o.inQueue, errs[1] = m.Float64Histogram("sluice.request.time_in_queue",
		metric.WithUnit("s"),
		metric.WithDescription("Time a call that waited in the queue spent in it, from the call to its return, by result and lane."),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10))
	o.lateness, errs[2] = m.Float64Histogram("sluice.request.lateness",
		metric.WithUnit("s"),
		metric.WithDescription("How late after its slot a rate-limited call that was granted returned; only calls that were late."),
		metric.WithExplicitBucketBoundaries(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1))
	o.shadow, errs[14] = m.Float64Histogram("sluice.shadow_wait",
		metric.WithUnit("s"),
		metric.WithDescription("A bucket in shadow mode (Config.Shadow): the wait each call would have had, by the result the limiter would have given (granted; refused, with its reason; failed: Redis did not answer, recorded as 0)."),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 30, 60))
	o.queued, errs[3] = m.Int64ObservableUpDownCounter("sluice.queued_requests",
		metric.WithUnit("{request}"),
		metric.WithDescription("Calls waiting to enter the limiter in this process now."))
	o.held, errs[4] = m.Int64ObservableUpDownCounter("sluice.held_permits",
		metric.WithUnit("{permit}"),
		metric.WithDescription("Weight this process holds now (semaphore, concurrency limiter)."))
	o.steps, errs[5] = m.Int64ObservableCounter("sluice.scheduler.steps",
		metric.WithUnit("{step}"),
		metric.WithDescription("Steps the bucket's scheduler ran in this process."))
	o.fenced, errs[6] = m.Int64ObservableCounter("sluice.scheduler.fenced_steps",
		metric.WithUnit("{step}"),
		metric.WithDescription("Scheduler steps refused because another process had taken the lock."))
	o.errs, errs[7] = m.Int64ObservableCounter("sluice.scheduler.errors",
		metric.WithUnit("{error}"),
		metric.WithDescription("Scheduler steps or lock requests that failed."))
	o.reentries, errs[8] = m.Int64ObservableCounter("sluice.reentries",
		metric.WithUnit("{reentry}"),
		metric.WithDescription("Times callers entered the bucket again after a stale or lost slot."))
	o.leases, errs[9] = m.Int64ObservableCounter("sluice.leases_lost",
		metric.WithUnit("{lease}"),
		metric.WithDescription("Semaphore permits whose lease ran out while held."))
	o.bQueued, errs[10] = m.Int64ObservableGauge("sluice.bucket.queued_requests",
		metric.WithUnit("{request}"),
		metric.WithDescription("Callers queued in the bucket in every process, read from Redis (TrackQueue)."))
	o.bWait, errs[11] = m.Float64ObservableGauge("sluice.bucket.wait",
		metric.WithUnit("s"),
		metric.WithDescription("How long a new caller of the bucket would wait for its slot, read from Redis (TrackQueue)."))
	o.local, errs[12] = m.Int64ObservableGauge("sluice.local_share",
		metric.WithUnit("1"),
		metric.WithDescription("1 while the limiter admits from this process's local share, Redis being unreachable (Config.Fallback); 0 otherwise, reported from the first time it did."))
	o.localReqs, errs[13] = m.Int64ObservableCounter("sluice.local_requests",
		metric.WithUnit("{request}"),
		metric.WithDescription("Calls this process's local share granted while Redis was unreachable (Config.Fallback)."))
	o.bLaneQ, errs[15] = m.Int64ObservableGauge("sluice.bucket.lane.queued_requests",
		metric.WithUnit("{request}"),
		metric.WithDescription("Callers queued in each lane of the bucket in every process, while named lanes have callers, read from Redis (TrackQueue)."))
	o.bLaneWait, errs[16] = m.Float64ObservableGauge("sluice.bucket.lane.wait",
		metric.WithUnit("s"),
		metric.WithDescription("How long a new caller of each lane of the bucket would wait for its slot, while named lanes have callers, read from Redis (TrackQueue)."))
	for _, err := range errs {
		if err != nil {
			return nil, fmt.Errorf("sluiceotel: %w", err)
		}
	}
	o.observed = []metric.Observable{o.queued, o.held, o.steps, o.fenced, o.errs, o.reentries, o.leases, o.local, o.localReqs}
	// The MeterProvider's Shutdown ends this callback with the provider.
	if _, err := m.RegisterCallback(func(_ context.Context, ob metric.Observer) error {
		o.sets.Range(func(_, v any) bool {
			a := v.(*eventAttrs)
			ob.ObserveInt64(o.requests, a.count.Load(), a.requests)
			return true
		})
		o.lanes.Range(func(_, v any) bool {
			l := v.(*limiterLanes)
			l.mu.Lock()
			defer l.mu.Unlock()
			for _, a := range l.sets {
				ob.ObserveInt64(o.requests, a.count.Load(), a.requests)
			}
			return true
		})
		return nil
	}, o.requests); err != nil {
		return nil, fmt.Errorf("sluiceotel: %w", err)
	}
	return o, nil
}

var _ sluice.Observer = (*Observer)(nil)

// Observe records one call to enter: one request under its result and
// lane, its time in the queue if it waited there (not a refusal), and its
// lateness if it was granted late; a shadow call (Event.Shadow) only as
// sluice.shadow_wait. The limiter calls it; it does not block (a call in
// a named lane takes its limiter's lock for the lanes, a map lookup).
func (o *Observer) Observe(e sluice.Event) {
	if e.Shadow { // let through: only what the limiter would have done
		o.shadow.Record(context.Background(), e.Wait.Seconds(), o.shadowAttrs(e)...)
		return
	}
	a := o.attrs(e)
	a.count.Add(1)
	ctx := context.Background()
	// A refusal took nothing and waited for nothing, whatever Queued says
	// (a full bucket reports the queue it met).
	if e.Queued && e.Result != sluice.Refused {
		o.inQueue.Record(ctx, e.Wait.Seconds(), a.inQueue...)
	}
	if e.Result == sluice.Granted && e.Late > 0 {
		o.lateness.Record(ctx, e.Late.Seconds(), a.lateness...)
	}
}

// shadowAttrs are a shadow event's options for sluice.shadow_wait (kind,
// name, result, reason), made once; kept apart from attrs, whose every
// entry sluice.requests reports.
func (o *Observer) shadowAttrs(e sluice.Event) []metric.RecordOption {
	k := eventKey{kind: e.Limiter, name: e.Name, reason: e.Reason, result: e.Result}
	if a, ok := o.shadowSets.Load(k); ok {
		return a.([]metric.RecordOption)
	}
	kv := []attribute.KeyValue{KindKey.String(k.kind), NameKey.String(k.name), ResultKey.String(k.result.String())}
	if k.reason != "" {
		kv = append(kv, ReasonKey.String(k.reason))
	}
	got, _ := o.shadowSets.LoadOrStore(k, []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(kv...))})
	return got.([]metric.RecordOption)
}

func (o *Observer) attrs(e sluice.Event) *eventAttrs {
	k := eventKey{kind: e.Limiter, name: e.Name, reason: e.Reason, result: e.Result}
	if e.Lane != "" {
		return o.laneAttrs(k, e.Lane)
	}
	if a, ok := o.sets.Load(k); ok {
		return a.(*eventAttrs)
	}
	got, _ := o.sets.LoadOrStore(k, newEventAttrs(k))
	return got.(*eventAttrs)
}

// newEventAttrs makes the options of the events of k (the lateness is
// the limiter's, not its lane's).
func newEventAttrs(k eventKey) *eventAttrs {
	kind, name, result := KindKey.String(k.kind), NameKey.String(k.name), ResultKey.String(k.result.String())
	inQueue := []attribute.KeyValue{kind, name, result}
	if k.lane != "" {
		inQueue = append(inQueue, LaneKey.String(k.lane))
	}
	withReason := inQueue
	if k.reason != "" {
		withReason = append(slices.Clip(inQueue), ReasonKey.String(k.reason))
	}
	return &eventAttrs{
		requests: metric.WithAttributeSet(attribute.NewSet(withReason...)),
		inQueue:  []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(inQueue...))},
		lateness: []metric.RecordOption{metric.WithAttributeSet(attribute.NewSet(kind, name))},
	}
}

// Track reports r's Stats at every collection under the limiter's kind and
// name, which should be those its Events carry ("bucket" and its
// Config.Name; "semaphore" and its Config.Name; "local.rate", "" ...).
// Reading Stats does no I/O. The callers waiting here are always reported;
// the other figures from the first collection where they are above 0
// (a bucket holds no permits, a semaphore runs no scheduler). Call the
// returned stop when the limiter is closed.
func (o *Observer) Track(kind, name string, r sluice.StatsReader) (stop func() error, err error) {
	opt := metric.WithAttributeSet(attribute.NewSet(KindKey.String(kind), NameKey.String(name)))
	var held, local atomic.Bool // above 0 once: report it from then on, 0 included
	reg, err := o.meter.RegisterCallback(func(_ context.Context, ob metric.Observer) error {
		s := r.Stats()
		ob.ObserveInt64(o.queued, s.Waiting, opt)
		if s.Held > 0 {
			held.Store(true)
		}
		if held.Load() {
			ob.ObserveInt64(o.held, s.Held, opt)
		}
		if s.Local {
			local.Store(true)
		}
		if local.Load() {
			v := int64(0)
			if s.Local {
				v = 1
			}
			ob.ObserveInt64(o.local, v, opt)
		}
		// Counters only grow: above 0 once is above 0 from then on.
		for _, c := range []struct {
			inst metric.Int64Observable
			v    int64
		}{{o.steps, s.Steps}, {o.fenced, s.Fenced}, {o.errs, s.Errors}, {o.reentries, s.Reentries}, {o.leases, s.LeasesLost}, {o.localReqs, s.LocalGranted}} {
			if c.v > 0 {
				ob.ObserveInt64(c.inst, c.v, opt)
			}
		}
		return nil
	}, o.observed...)
	if err != nil {
		return nil, fmt.Errorf("sluiceotel: track %s %q: %w", kind, name, err)
	}
	return reg.Unregister, nil
}

// TrackQueue reports, at every collection, the callers queued in b across
// every process and the wait a new caller would have, both read with
// b.Inspect; and while named lanes have callers, the same for each lane
// (Inspection.Lanes): the lanes with the most callers under their own
// name (as many as WithTopLanes allows, at most 20), the default lane
// without sluice.lane, and the callers of the others summed under "other"
// (no wait). It is opt-in because each collection costs a Redis round
// trip, two while named lanes have callers (bounded by the collection's
// context and by 1 s); a collection where Redis does not answer reports
// none of the figures and returns the error to the MeterProvider. Call
// the returned stop before closing b.
func (o *Observer) TrackQueue(b *bucket.Bucket) (stop func() error, err error) {
	name := b.Config().Name
	opt := metric.WithAttributeSet(attribute.NewSet(KindKey.String("bucket"), NameKey.String(name)))
	reg, err := o.meter.RegisterCallback(func(ctx context.Context, ob metric.Observer) error {
		ctx, cancel := context.WithTimeout(ctx, inspectTimeout)
		defer cancel()
		in, err := b.Inspect(ctx)
		if err != nil {
			return fmt.Errorf("sluiceotel: inspect bucket %q: %w", name, err)
		}
		ob.ObserveInt64(o.bQueued, int64(in.Queued), opt)
		ob.ObserveFloat64(o.bWait, in.Wait.Seconds(), opt)
		o.observeLanes(ob, name, in)
		return nil
	}, o.bQueued, o.bWait, o.bLaneQ, o.bLaneWait)
	if err != nil {
		return nil, fmt.Errorf("sluiceotel: track queue of bucket %q: %w", name, err)
	}
	return reg.Unregister, nil
}
