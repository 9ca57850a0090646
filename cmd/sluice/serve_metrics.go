package main

import (
	"bufio"
	"cmp"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	sl "github.com/sluicehq/sluice"
)

// GET /metrics: the served buckets' and semaphores' metrics in
// Prometheus's text format (version 0.0.4), under the names, labels, help
// and histogram buckets of package metrics/sluiceprometheus, so that one
// dashboard reads a library process's metrics and a server's.
//
// The adapter itself is not used: it is a module of its own so that the
// root module never requires Prometheus's client, and cmd/sluice is in
// the root module. What it records comes from two hooks of the library,
// sluice.Observer (each call to enter) and Stats (read at each scrape), and
// the text format is a few lines of text per series: this file writes
// them. What it leaves out is the adapter's TrackQueue (a Redis round
// trip per bucket per scrape): GET /v1/buckets/{name} reads a bucket
// across every process.

// Histogram bounds, in seconds: sluiceprometheus's.
var (
	inQueueBounds  = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}
	latenessBounds = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1}
)

// serveMetrics is the served limiters' Config.Observer: it counts each
// call to enter under its limiter, result and reason.
type serveMetrics struct {
	events sync.Map // eventKey → *eventSeries
}

var _ sl.Observer = (*serveMetrics)(nil)

type eventKey struct {
	kind, name, reason string
	result             sl.Result
}

// eventSeries is what the calls of one eventKey added up to.
type eventSeries struct {
	requests atomic.Int64
	inQueue  *histogram // nil for refusals, which never wait in the queue
	lateness *histogram // grants only
}

// histogram counts observations in seconds by bound, without locks.
type histogram struct {
	bounds []float64
	counts []atomic.Int64 // counts[i]: at most bounds[i] and above bounds[i-1]; the last, above every bound
	sumNS  atomic.Int64
}

func newHistogram(bounds []float64) *histogram {
	return &histogram{bounds: bounds, counts: make([]atomic.Int64, len(bounds)+1)}
}

func (h *histogram) observe(ns int64) {
	i, _ := slices.BinarySearch(h.bounds, float64(ns)/1e9) // the first bound ≥ the value: Prometheus's le
	h.counts[i].Add(1)
	h.sumNS.Add(ns)
}

// Observe records one call (sluice.Observer), as sluiceprometheus does: a
// request under its result and reason, its time in the queue if it
// waited there (not a refusal), its lateness if it was granted late.
func (m *serveMetrics) Observe(e sl.Event) {
	k := eventKey{kind: e.Limiter, name: e.Name, reason: e.Reason, result: e.Result}
	v, ok := m.events.Load(k)
	if !ok {
		es := &eventSeries{}
		if e.Result != sl.Refused {
			es.inQueue = newHistogram(inQueueBounds)
		}
		if e.Result == sl.Granted {
			es.lateness = newHistogram(latenessBounds)
		}
		v, _ = m.events.LoadOrStore(k, es)
	}
	es := v.(*eventSeries)
	es.requests.Add(1)
	if e.Queued && es.inQueue != nil {
		es.inQueue.observe(int64(e.Wait))
	}
	if e.Late > 0 && es.lateness != nil {
		es.lateness.observe(int64(e.Late))
	}
}

// tracked is one served handle as a scrape reads it.
type tracked struct {
	kind, name string
	stats      sl.Stats
	seen       *seen
}

// seen keeps, per handle, whether a figure the adapter reports "from the
// first time above 0" has been.
type seen struct{ held, local atomic.Bool }

// metrics answers GET /metrics.
func (s *sidecar) metrics(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	handles := make([]tracked, 0, len(s.buckets)+len(s.semaphores))
	for name, sb := range s.buckets {
		handles = append(handles, tracked{kind: "bucket", name: name, stats: sb.l.Stats(), seen: &sb.seen})
	}
	for name, ss := range s.semaphores {
		handles = append(handles, tracked{kind: "semaphore", name: name, stats: ss.l.Stats(), seen: &ss.seen})
	}
	s.mu.Unlock()
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	bw := bufio.NewWriter(w)
	s.observer.write(bw, handles)
	bw.Flush()
}

// sample is one line of a family: its labels (name="value" pairs, in
// order) and value.
type sample struct {
	suffix string // _bucket, _sum, _count for a histogram's lines
	labels []string
	value  float64
}

// family is one metric: its samples, written only when it has some (as
// client_golang does).
type family struct {
	name, typ, help string
	samples         []sample
}

func (f *family) add(suffix string, value float64, labels ...string) {
	f.samples = append(f.samples, sample{suffix: suffix, labels: labels, value: value})
}

// addHistogram adds h's lines: cumulative buckets, their sum and count.
func (f *family) addHistogram(h *histogram, labels ...string) {
	var n int64
	for i, b := range h.bounds {
		n += h.counts[i].Load()
		f.add("_bucket", float64(n), append(slices.Clip(labels), "le", formatFloat(b))...)
	}
	n += h.counts[len(h.bounds)].Load()
	f.add("_bucket", float64(n), append(slices.Clip(labels), "le", "+Inf")...)
	f.add("_sum", float64(h.sumNS.Load())/1e9, labels...)
	f.add("_count", float64(n), labels...) // the +Inf bucket's, so that they never disagree
}

// write writes the families of the events recorded and of handles' Stats.
func (m *serveMetrics) write(w *bufio.Writer, handles []tracked) {
	requests := &family{name: "sluice_requests_total", typ: "counter", help: "Calls that tried to enter a limiter, by result (and reason, when refused or failed)."}
	inQueue := &family{name: "sluice_request_time_in_queue_seconds", typ: "histogram", help: "Time a call that waited in the queue spent in it, from the call to its return, by result."}
	lateness := &family{name: "sluice_request_lateness_seconds", typ: "histogram", help: "How late after its slot a rate-limited call that was granted returned; only calls that were late."}

	var keys []eventKey
	m.events.Range(func(k, _ any) bool {
		keys = append(keys, k.(eventKey))
		return true
	})
	slices.SortFunc(keys, func(a, b eventKey) int {
		return cmp.Or(cmp.Compare(a.kind, b.kind), cmp.Compare(a.name, b.name), cmp.Compare(a.result.String(), b.result.String()), cmp.Compare(a.reason, b.reason))
	})
	// The time in the queue is by result, not reason: the series of one
	// result's reasons (adjacent once sorted) add up in one histogram.
	var merged *histogram
	var mergedKey eventKey
	flush := func() {
		if merged != nil {
			inQueue.addHistogram(merged, "sluice_limiter_kind", mergedKey.kind, "sluice_limiter_name", mergedKey.name, "sluice_result", mergedKey.result.String())
			merged = nil
		}
	}
	for _, k := range keys {
		v, _ := m.events.Load(k)
		es := v.(*eventSeries)
		requests.add("", float64(es.requests.Load()), "sluice_limiter_kind", k.kind, "sluice_limiter_name", k.name, "sluice_reason", k.reason, "sluice_result", k.result.String())
		if es.lateness != nil {
			lateness.addHistogram(es.lateness, "sluice_limiter_kind", k.kind, "sluice_limiter_name", k.name)
		}
		if es.inQueue == nil {
			continue
		}
		if merged != nil && (mergedKey.kind != k.kind || mergedKey.name != k.name || mergedKey.result != k.result) {
			flush()
		}
		if merged == nil {
			merged, mergedKey = newHistogram(inQueueBounds), k
		}
		for i := range es.inQueue.counts {
			merged.counts[i].Add(es.inQueue.counts[i].Load())
		}
		merged.sumNS.Add(es.inQueue.sumNS.Load())
	}
	flush()

	gauge := func(name, help string) *family { return &family{name: name, typ: "gauge", help: help} }
	counter := func(name, help string) *family { return &family{name: name, typ: "counter", help: help} }
	queued := gauge("sluice_queued_requests", "Calls waiting to enter the limiter in this process now.")
	held := gauge("sluice_held_permits", "Weight this process holds now (semaphore, concurrency limiter).")
	local := gauge("sluice_local_share", "1 while the limiter admits from this process's local share, Redis being unreachable (Config.Fallback); 0 otherwise, reported from the first time it did.")
	steps := counter("sluice_scheduler_steps_total", "Steps the bucket's scheduler ran in this process.")
	fenced := counter("sluice_scheduler_fenced_steps_total", "Scheduler steps refused because another process had taken the lock.")
	errs := counter("sluice_scheduler_errors_total", "Scheduler steps or lock requests that failed.")
	reentries := counter("sluice_reentries_total", "Times callers entered the bucket again after a stale or lost slot.")
	leases := counter("sluice_leases_lost_total", "Semaphore permits whose lease ran out while held.")
	localReqs := counter("sluice_local_requests_total", "Calls this process's local share granted while Redis was unreachable (Config.Fallback).")
	slices.SortFunc(handles, func(a, b tracked) int { return cmp.Or(cmp.Compare(a.kind, b.kind), cmp.Compare(a.name, b.name)) })
	for _, h := range handles {
		st, labels := h.stats, []string{"sluice_limiter_kind", h.kind, "sluice_limiter_name", h.name}
		queued.add("", float64(st.Waiting), labels...)
		if st.Held > 0 {
			h.seen.held.Store(true)
		}
		if h.seen.held.Load() {
			held.add("", float64(st.Held), labels...)
		}
		if st.Local {
			h.seen.local.Store(true)
		}
		if h.seen.local.Load() {
			local.add("", float64(b2i(st.Local)), labels...)
		}
		// Counters only grow: above 0 once is above 0 from then on.
		for _, c := range []struct {
			f *family
			v int64
		}{{steps, st.Steps}, {fenced, st.Fenced}, {errs, st.Errors}, {reentries, st.Reentries}, {leases, st.LeasesLost}, {localReqs, st.LocalGranted}} {
			if c.v > 0 {
				c.f.add("", float64(c.v), labels...)
			}
		}
	}
	for _, f := range []*family{requests, inQueue, lateness, queued, held, steps, fenced, errs, reentries, leases, local, localReqs} {
		f.write(w)
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// write writes f in the text format, nothing when it has no sample.
func (f *family) write(w *bufio.Writer) {
	if len(f.samples) == 0 {
		return
	}
	w.WriteString("# HELP " + f.name + " " + helpEscaper.Replace(f.help) + "\n")
	w.WriteString("# TYPE " + f.name + " " + f.typ + "\n")
	for _, s := range f.samples {
		w.WriteString(f.name + s.suffix)
		sep := "{"
		for i := 0; i+1 < len(s.labels); i += 2 {
			w.WriteString(sep + s.labels[i] + `="` + labelEscaper.Replace(s.labels[i+1]) + `"`)
			sep = ","
		}
		if len(s.labels) > 0 {
			w.WriteString("}")
		}
		w.WriteString(" " + formatFloat(s.value) + "\n")
	}
}

var (
	helpEscaper  = strings.NewReplacer(`\`, `\\`, "\n", `\n`)
	labelEscaper = strings.NewReplacer(`\`, `\\`, "\n", `\n`, `"`, `\"`)
)

// formatFloat writes v as the text format does (client_golang's writeFloat).
func formatFloat(v float64) string {
	switch {
	case math.IsInf(v, +1):
		return "+Inf"
	case math.IsInf(v, -1):
		return "-Inf"
	case math.IsNaN(v):
		return "NaN"
	}
	return strconv.FormatFloat(v, 'g', -1, 64)
}
