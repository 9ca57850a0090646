// Package sluiceprometheus records Sluice's limiters as Prometheus metrics,
// for users who do not run OpenTelemetry (package sluiceotel records the
// same figures through the OpenTelemetry metric API).
//
// It lives in a module of its own so that a user of Sluice who does not
// import it does not pay for client_golang (as go-redis keeps
// extra/redisprometheus apart).
//
// A Collector is both a prometheus.Collector, registered once, and a
// sluice.Observer, set as the limiters' Config.Observer:
//
//   - Observe records every call to enter as it returns: the requests by
//     result and lane, the time queued callers waited, and how late
//     rate-limited callers started.
//   - Track reads a limiter's Stats (no I/O) at each scrape: callers
//     waiting in this process, permits held, the bucket's scheduler steps,
//     re-entries and lost leases.
//   - TrackQueue, opt-in, reads a bucket across every process with
//     bucket.Inspect at each scrape: one Redis round trip per scrape (two
//     while named lanes have callers).
//
// A bucket's lanes (bucket.WithLane) are the label sluice_lane of the
// requests and of the time in queue: "" for the default lane, the lane's
// name for the lanes of a limiter with the most calls lately (at most
// 20, WithTopLanes), "other" for the rest, so that thousands of tenants
// make a few series, not thousands.
//
// The metric and label names are those package sluiceotel's metrics take
// through OpenTelemetry's Prometheus exporter, so that one dashboard reads
// either. docs/observability.md lists every metric.
package sluiceprometheus

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/metrics/lanelabel"
)

// inspectTimeout bounds TrackQueue's read of Redis during a scrape: a
// Redis that does not answer must not stall the scrape.
const inspectTimeout = time.Second

// Collector records Sluice's limiters for Prometheus. It is a
// prometheus.Collector and a sluice.Observer; one Collector serves any
// number of limiters, each under its kind and name (the labels
// sluice_limiter_kind and sluice_limiter_name). It is safe for concurrent
// use. Make it with New.
type Collector struct {
	requests *prometheus.CounterVec
	inQueue  *prometheus.HistogramVec
	lateness *prometheus.HistogramVec
	shadow   *prometheus.HistogramVec
	// children caches each kind of event's metrics in the default lane,
	// so that recording one looks no labels up: an eventKey holds
	// *children. The named lanes' are their limiter's (lanes).
	children sync.Map
	topLanes int
	lanes    sync.Map // limiterKey → *limiterLanes

	queued, held, steps, fenced, errs, reentries, leases, local, localReqs *prometheus.Desc
	bQueued, bWait, bErrs, bLaneQueued, bLaneWait                          *prometheus.Desc

	mu     sync.Mutex
	stats  map[*tracked]struct{}
	queues map[*queueTrack]struct{}
}

type eventKey struct {
	kind, name, reason string
	result             sluice.Result
	lane               string // the label: "" (the default lane), a lane's name, or "other"
}

type children struct {
	requests prometheus.Counter
	inQueue  prometheus.Observer
	lateness prometheus.Observer
}

// tracked is one limiter given to Track.
type tracked struct {
	kind, name string
	r          sluice.StatsReader
	held       atomic.Bool // Held was above 0 once: report it from then on, 0 included
	local      atomic.Bool // Local was true once: report it from then on
}

// queueTrack is one bucket given to TrackQueue.
type queueTrack struct {
	b      *bucket.Bucket
	name   string
	failed atomic.Int64
}

// Option configures a Collector (New).
type Option func(*Collector)

// WithTopLanes labels, for each limiter, at most n lanes by their own
// name: the lanes with the most calls lately (a lane takes the label of
// the least busy labelled lane once it has seen more than twice its calls
// in the last minute or two); the others are labelled "other". The
// default is 20; n ≤ 0 labels every named lane "other". TrackQueue lists
// at most n lanes too (and at most the 20 bucket.Inspect reads).
func WithTopLanes(n int) Option {
	return func(c *Collector) { c.topLanes = max(n, 0) }
}

// New returns a Collector; register it (prometheus.MustRegister(c)) and
// set it as the limiters' Config.Observer.
func New(opts ...Option) *Collector {
	labels := []string{"sluice_limiter_kind", "sluice_limiter_name"}
	desc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	laneDesc := func(name, help string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, append(labels, "sluice_lane"), nil)
	}
	c := &Collector{
		topLanes: lanelabel.DefaultTop,
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_requests_total",
			Help: "Calls that tried to enter a limiter, by result (and reason, when refused or failed) and lane.",
		}, []string{"sluice_limiter_kind", "sluice_limiter_name", "sluice_result", "sluice_reason", "sluice_lane"}),
		inQueue: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_request_time_in_queue_seconds",
			Help:    "Time a call that waited in the queue spent in it, from the call to its return, by result and lane.",
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10},
		}, []string{"sluice_limiter_kind", "sluice_limiter_name", "sluice_result", "sluice_lane"}),
		lateness: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_request_lateness_seconds",
			Help:    "How late after its slot a rate-limited call that was granted returned; only calls that were late.",
			Buckets: []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1},
		}, labels),
		shadow: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "sluice_shadow_wait_seconds",
			Help:    "A bucket in shadow mode (Config.Shadow): the wait each call would have had, by the result the limiter would have given (granted; refused, with its reason; failed: Redis did not answer, observed as 0).",
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 30, 60},
		}, []string{"sluice_limiter_kind", "sluice_limiter_name", "sluice_result", "sluice_reason"}),
		queued:    desc("sluice_queued_requests", "Calls waiting to enter the limiter in this process now."),
		held:      desc("sluice_held_permits", "Weight this process holds now (semaphore, concurrency limiter)."),
		steps:     desc("sluice_scheduler_steps_total", "Steps the bucket's scheduler ran in this process."),
		fenced:    desc("sluice_scheduler_fenced_steps_total", "Scheduler steps refused because another process had taken the lock."),
		errs:      desc("sluice_scheduler_errors_total", "Scheduler steps or lock requests that failed."),
		reentries: desc("sluice_reentries_total", "Times callers entered the bucket again after a stale or lost slot."),
		leases:    desc("sluice_leases_lost_total", "Semaphore permits whose lease ran out while held."),
		bQueued:   desc("sluice_bucket_queued_requests", "Callers queued in the bucket in every process, read from Redis (TrackQueue)."),
		bWait:     desc("sluice_bucket_wait_seconds", "How long a new caller of the bucket would wait for its slot, read from Redis (TrackQueue)."),
		local:     desc("sluice_local_share", "1 while the limiter admits from this process's local share, Redis being unreachable (Config.Fallback); 0 otherwise, reported from the first time it did."),
		localReqs: desc("sluice_local_requests_total", "Calls this process's local share granted while Redis was unreachable (Config.Fallback)."),
		bErrs:     desc("sluice_bucket_inspect_errors_total", "Scrapes where reading the bucket from Redis failed (TrackQueue); its figures were left out."),
		bLaneQueued: laneDesc("sluice_bucket_lane_queued_requests",
			"Callers queued in each lane of the bucket in every process, while named lanes have callers, read from Redis (TrackQueue)."),
		bLaneWait: laneDesc("sluice_bucket_lane_wait_seconds",
			"How long a new caller of each lane of the bucket would wait for its slot, while named lanes have callers, read from Redis (TrackQueue)."),
		stats:  map[*tracked]struct{}{},
		queues: map[*queueTrack]struct{}{},
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

var (
	_ sluice.Observer      = (*Collector)(nil)
	_ prometheus.Collector = (*Collector)(nil)
)

// Observe records one call to enter: one request under its result and
// lane, its time in the queue if it waited there (not a refusal), and
// its lateness if it was granted late; a shadow call (Event.Shadow) only
// as sluice_shadow_wait_seconds. The limiter calls it; it does not block
// (a call in a named lane takes its limiter's lock for the lanes, a map
// lookup).
func (c *Collector) Observe(e sluice.Event) {
	if e.Shadow { // let through: only what the limiter would have done
		c.shadow.WithLabelValues(e.Limiter, e.Name, e.Result.String(), e.Reason).Observe(e.Wait.Seconds())
		return
	}
	ch := c.child(e)
	ch.requests.Inc()
	// A refusal took nothing and waited for nothing, whatever Queued says
	// (a full bucket reports the queue it met).
	if e.Queued && e.Result != sluice.Refused {
		ch.inQueue.Observe(e.Wait.Seconds())
	}
	if e.Result == sluice.Granted && e.Late > 0 {
		ch.lateness.Observe(e.Late.Seconds())
	}
}

func (c *Collector) child(e sluice.Event) *children {
	k := eventKey{kind: e.Limiter, name: e.Name, reason: e.Reason, result: e.Result}
	if e.Lane != "" {
		return c.laneChild(k, e.Lane)
	}
	if ch, ok := c.children.Load(k); ok {
		return ch.(*children)
	}
	got, _ := c.children.LoadOrStore(k, c.newChildren(k))
	return got.(*children)
}

// newChildren is the metrics of the events of k: only the series an
// event of this kind can add to (a refusal has no time in the queue, only
// a grant has a lateness, which is the limiter's, not its lane's).
func (c *Collector) newChildren(k eventKey) *children {
	result := k.result.String()
	ch := &children{requests: c.requests.WithLabelValues(k.kind, k.name, result, k.reason, k.lane)}
	if k.result != sluice.Refused {
		ch.inQueue = c.inQueue.WithLabelValues(k.kind, k.name, result, k.lane)
	}
	if k.result == sluice.Granted {
		ch.lateness = c.lateness.WithLabelValues(k.kind, k.name)
	}
	return ch
}

// Track reports r's Stats at every scrape under the limiter's kind and
// name, which should be those its Events carry ("bucket" and its
// Config.Name; "semaphore" and its Config.Name; "local.rate", "" ...).
// Track each limiter once. Reading Stats does no I/O. The callers waiting
// here are always reported; the other figures from the first scrape where
// they are above 0 (a bucket holds no permits, a semaphore runs no
// scheduler). Call the returned stop when the limiter is closed.
func (c *Collector) Track(kind, name string, r sluice.StatsReader) (stop func()) {
	t := &tracked{kind: kind, name: name, r: r}
	c.mu.Lock()
	c.stats[t] = struct{}{}
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		delete(c.stats, t)
		c.mu.Unlock()
	}
}

// TrackQueue reports, at every scrape, the callers queued in b across
// every process and the wait a new caller would have, both read with
// b.Inspect; and while named lanes have callers, the same for each lane
// (Inspection.Lanes): the lanes with the most callers under their own
// name (as many as WithTopLanes allows, at most 20), the default lane
// under "", and the callers of the others summed under "other" (no wait).
// It is opt-in because each scrape costs a Redis round trip, two while
// named lanes have callers (at most 1 s); a scrape where Redis does not
// answer leaves the figures out and counts the failure in
// sluice_bucket_inspect_errors_total rather than failing the whole
// scrape. Call the returned stop before closing b.
func (c *Collector) TrackQueue(b *bucket.Bucket) (stop func()) {
	q := &queueTrack{b: b, name: b.Config().Name}
	c.mu.Lock()
	c.queues[q] = struct{}{}
	c.mu.Unlock()
	return func() {
		c.mu.Lock()
		delete(c.queues, q)
		c.mu.Unlock()
	}
}

// Describe sends the descriptors of every metric the Collector reports
// (prometheus.Collector).
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	c.requests.Describe(ch)
	c.inQueue.Describe(ch)
	c.lateness.Describe(ch)
	c.shadow.Describe(ch)
	for _, d := range []*prometheus.Desc{c.queued, c.held, c.steps, c.fenced, c.errs, c.reentries, c.leases, c.local, c.localReqs, c.bQueued, c.bWait, c.bErrs, c.bLaneQueued, c.bLaneWait} {
		ch <- d
	}
}

// Collect sends the metrics (prometheus.Collector): the events recorded,
// the Stats of the tracked limiters and, for TrackQueue, each bucket read
// from Redis.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	c.requests.Collect(ch)
	c.inQueue.Collect(ch)
	c.lateness.Collect(ch)
	c.shadow.Collect(ch)
	c.mu.Lock()
	stats := make([]*tracked, 0, len(c.stats))
	for t := range c.stats {
		stats = append(stats, t)
	}
	queues := make([]*queueTrack, 0, len(c.queues))
	for q := range c.queues {
		queues = append(queues, q)
	}
	c.mu.Unlock()
	for _, t := range stats {
		s := t.r.Stats()
		ch <- prometheus.MustNewConstMetric(c.queued, prometheus.GaugeValue, float64(s.Waiting), t.kind, t.name)
		if s.Held > 0 {
			t.held.Store(true)
		}
		if t.held.Load() {
			ch <- prometheus.MustNewConstMetric(c.held, prometheus.GaugeValue, float64(s.Held), t.kind, t.name)
		}
		if s.Local {
			t.local.Store(true)
		}
		if t.local.Load() {
			v := 0.0
			if s.Local {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(c.local, prometheus.GaugeValue, v, t.kind, t.name)
		}
		// Counters only grow: above 0 once is above 0 from then on.
		for _, f := range []struct {
			d *prometheus.Desc
			v int64
		}{{c.steps, s.Steps}, {c.fenced, s.Fenced}, {c.errs, s.Errors}, {c.reentries, s.Reentries}, {c.leases, s.LeasesLost}, {c.localReqs, s.LocalGranted}} {
			if f.v > 0 {
				ch <- prometheus.MustNewConstMetric(f.d, prometheus.CounterValue, float64(f.v), t.kind, t.name)
			}
		}
	}
	// The buckets are read from Redis together, so a scrape waits for the
	// slowest one, not for their sum.
	var wg sync.WaitGroup
	for _, q := range queues {
		wg.Go(func() { c.collectQueue(ch, q) })
	}
	wg.Wait()
}

func (c *Collector) collectQueue(ch chan<- prometheus.Metric, q *queueTrack) {
	ctx, cancel := context.WithTimeout(context.Background(), inspectTimeout)
	defer cancel()
	in, err := q.b.Inspect(ctx)
	if err != nil {
		q.failed.Add(1)
	} else {
		ch <- prometheus.MustNewConstMetric(c.bQueued, prometheus.GaugeValue, float64(in.Queued), "bucket", q.name)
		ch <- prometheus.MustNewConstMetric(c.bWait, prometheus.GaugeValue, in.Wait.Seconds(), "bucket", q.name)
		c.collectLanes(ch, q.name, in)
	}
	ch <- prometheus.MustNewConstMetric(c.bErrs, prometheus.CounterValue, float64(q.failed.Load()), "bucket", q.name)
}
