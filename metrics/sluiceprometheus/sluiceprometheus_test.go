package sluiceprometheus_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/testing/buckettest"
	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/internal/testing/testkit"
	"github.com/sluicehq/sluice/metrics/sluiceprometheus"
)

// tee keeps every event before handing it to the Collector under test,
// so the test can compare the metrics with what the limiter reported.
type tee struct {
	next   sluice.Observer
	mu     sync.Mutex
	events []sluice.Event
}

func (t *tee) Observe(e sluice.Event) {
	t.mu.Lock()
	t.events = append(t.events, e)
	t.mu.Unlock()
	t.next.Observe(e)
}

func (t *tee) count(keep func(sluice.Event) bool) uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var n uint64
	for _, e := range t.events {
		if keep(e) {
			n++
		}
	}
	return n
}

func newRegistry(t *testing.T) (*sluiceprometheus.Collector, *prometheus.Registry) {
	t.Helper()
	c := sluiceprometheus.New()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(c); err != nil {
		t.Fatal(err)
	}
	return c, reg
}

// point is the metric name under exactly the labels, or nil.
func point(t *testing.T, reg prometheus.Gatherer, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	metrics:
		for _, m := range mf.GetMetric() {
			got := map[string]string{}
			for _, lp := range m.GetLabel() {
				got[lp.GetName()] = lp.GetValue()
			}
			if len(got) != len(labels) {
				continue
			}
			for k, v := range labels {
				if got[k] != v {
					continue metrics
				}
			}
			return m
		}
	}
	return nil
}

var waitFor = testkit.WaitFor

func newBucket(t *testing.T, srv *redistest.Server, cfg bucket.Config) *bucket.Bucket {
	t.Helper()
	rdb := srv.Client()
	t.Cleanup(func() { rdb.Close() })
	return buckettest.New(t, rdb, cfg)
}

// TestBucketMetrics: a bucket's grants, refusals and cancellations, its
// callers waiting here and in Redis, their time in the queue and the
// scheduler's steps, as a Prometheus registry gathers them against a real
// Redis; the names pass promlint.
func TestBucketMetrics(t *testing.T) {
	srv := redistest.New(t)
	c, reg := newRegistry(t)
	rec := &tee{next: c}
	ctx, cancelAll := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancelAll()

	// Five grants at once, then two callers wait (a refill an hour away)
	// and a full queue refuses three more.
	name := t.Name()
	b := newBucket(t, srv, bucket.Config{Name: name, Capacity: 5, RefillAmount: 1, RefillFrequency: time.Hour, MaxQueue: 2, Observer: rec})
	stop := c.Track("bucket", name, b)
	stopQueue := c.TrackQueue(b)
	for range 5 {
		if err := b.Enter(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// The waiters have no deadline: one that their turn, an hour off,
	// passes would be refused at once.
	gone, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	for range 2 {
		go func() { done <- b.Enter(gone) }()
	}
	waitFor(t, 5*time.Second, "two callers to queue", func() bool {
		in, err := b.Inspect(ctx)
		return err == nil && in.Queued == 2 && b.Stats().Waiting == 2
	})
	for range 3 {
		if err := b.Enter(ctx); !errors.Is(err, sluice.ErrQueueFull) {
			t.Fatalf("Enter on a full queue = %v, want ErrQueueFull", err)
		}
	}
	want := fmt.Sprintf(`
# HELP sluice_requests_total Calls that tried to enter a limiter, by result (and reason, when refused or failed) and lane.
# TYPE sluice_requests_total counter
sluice_requests_total{sluice_lane="",sluice_limiter_kind="bucket",sluice_limiter_name=%[1]q,sluice_reason="",sluice_result="granted"} 5
sluice_requests_total{sluice_lane="",sluice_limiter_kind="bucket",sluice_limiter_name=%[1]q,sluice_reason="queue_full",sluice_result="refused"} 3
# HELP sluice_queued_requests Calls waiting to enter the limiter in this process now.
# TYPE sluice_queued_requests gauge
sluice_queued_requests{sluice_limiter_kind="bucket",sluice_limiter_name=%[1]q} 2
# HELP sluice_bucket_queued_requests Callers queued in the bucket in every process, read from Redis (TrackQueue).
# TYPE sluice_bucket_queued_requests gauge
sluice_bucket_queued_requests{sluice_limiter_kind="bucket",sluice_limiter_name=%[1]q} 2
# HELP sluice_bucket_inspect_errors_total Scrapes where reading the bucket from Redis failed (TrackQueue); its figures were left out.
# TYPE sluice_bucket_inspect_errors_total counter
sluice_bucket_inspect_errors_total{sluice_limiter_kind="bucket",sluice_limiter_name=%[1]q} 0
`, name)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sluice_requests_total", "sluice_queued_requests", "sluice_bucket_queued_requests", "sluice_bucket_inspect_errors_total", "sluice_held_permits"); err != nil {
		t.Error(err)
	}
	labels := map[string]string{"sluice_limiter_kind": "bucket", "sluice_limiter_name": name}
	if m := point(t, reg, "sluice_bucket_wait_seconds", labels); m == nil || m.GetGauge().GetValue() < 59*60 {
		t.Errorf("sluice_bucket_wait_seconds = %v, want about an hour: the refill a new caller would wait for", m)
	}

	cancel()
	for range 2 {
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("canceled caller = %v", err)
		}
	}
	// A cancel reaches Redis after the caller returned (cancels are batched).
	waitFor(t, 5*time.Second, "the cancels to reach Redis", func() bool {
		in, err := b.Inspect(ctx)
		return err == nil && in.Queued == 0
	})
	canceled := map[string]string{"sluice_limiter_kind": "bucket", "sluice_limiter_name": name, "sluice_result": "canceled", "sluice_lane": ""}
	if m := point(t, reg, "sluice_requests_total", map[string]string{"sluice_limiter_kind": "bucket", "sluice_limiter_name": name, "sluice_result": "canceled", "sluice_reason": "", "sluice_lane": ""}); m.GetCounter().GetValue() != 2 {
		t.Errorf("canceled requests %v, want 2", m)
	}
	if m := point(t, reg, "sluice_request_time_in_queue_seconds", canceled); m.GetHistogram().GetSampleCount() != 2 {
		t.Errorf("time in queue of canceled callers %v, want 2 samples", m)
	}
	if m := point(t, reg, "sluice_request_time_in_queue_seconds", map[string]string{"sluice_limiter_kind": "bucket", "sluice_limiter_name": name, "sluice_result": "refused", "sluice_lane": ""}); m != nil {
		t.Errorf("time in queue recorded for refusals, which never waited: %v", m)
	}
	for _, n := range []string{"sluice_queued_requests", "sluice_bucket_queued_requests"} {
		if m := point(t, reg, n, labels); m.GetGauge().GetValue() != 0 {
			t.Errorf("%s %v, want 0", n, m)
		}
	}
	stop()
	stopQueue()
	for _, n := range []string{"sluice_queued_requests", "sluice_bucket_queued_requests"} {
		if m := point(t, reg, n, labels); m != nil {
			t.Errorf("%s still reported after stop: %v", n, m)
		}
	}

	// Callers that queue and are granted in turn: time in the queue and
	// lateness as the events say, and the scheduler's steps.
	paced := t.Name() + "-paced"
	p := newBucket(t, srv, bucket.Config{Name: paced, Capacity: 1, RefillAmount: 1, RefillFrequency: 50 * time.Millisecond, Observer: rec})
	c.Track("bucket", paced, p)
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			if err := p.Enter(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	isPaced := func(e sluice.Event) bool { return e.Name == paced && e.Result == sluice.Granted }
	queued := rec.count(func(e sluice.Event) bool { return isPaced(e) && e.Queued })
	late := rec.count(func(e sluice.Event) bool { return isPaced(e) && e.Late > 0 })
	if queued < 4 {
		t.Errorf("%d of 6 callers queued, want at least 4 with a token per 50 ms", queued)
	}
	pl := map[string]string{"sluice_limiter_kind": "bucket", "sluice_limiter_name": paced}
	pg := map[string]string{"sluice_limiter_kind": "bucket", "sluice_limiter_name": paced, "sluice_result": "granted", "sluice_lane": ""}
	if m := point(t, reg, "sluice_request_time_in_queue_seconds", pg); m.GetHistogram().GetSampleCount() != queued {
		t.Errorf("time in queue %v, want %d samples", m, queued)
	}
	if m := point(t, reg, "sluice_request_lateness_seconds", pl); m.GetHistogram().GetSampleCount() != late {
		t.Errorf("lateness %v, want %d samples", m, late)
	}
	m := point(t, reg, "sluice_scheduler_steps_total", pl)
	if after := p.Stats().Steps; m == nil || m.GetCounter().GetValue() < 1 || m.GetCounter().GetValue() > float64(after) {
		t.Errorf("sluice_scheduler_steps_total %v, want between 1 and Stats().Steps read after, %d", m, after)
	}
	problems, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("promlint: %s: %s", p.Metric, p.Text)
	}
}

// TestTrackQueueRedisDown: a scrape while Redis is down leaves the
// bucket-wide figures out, counts the failure, does not hang, and still
// reports this process's figures.
func TestTrackQueueRedisDown(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	c, reg := newRegistry(t)
	name := t.Name()
	b := newBucket(t, srv, bucket.Config{Name: name, Capacity: 1, RefillAmount: 1, RefillFrequency: time.Second, Observer: c})
	c.Track("bucket", name, b)
	c.TrackQueue(b)
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	want := fmt.Sprintf(`
# HELP sluice_bucket_inspect_errors_total Scrapes where reading the bucket from Redis failed (TrackQueue); its figures were left out.
# TYPE sluice_bucket_inspect_errors_total counter
sluice_bucket_inspect_errors_total{sluice_limiter_kind="bucket",sluice_limiter_name=%[1]q} 1
# HELP sluice_queued_requests Calls waiting to enter the limiter in this process now.
# TYPE sluice_queued_requests gauge
sluice_queued_requests{sluice_limiter_kind="bucket",sluice_limiter_name=%[1]q} 0
`, name)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sluice_bucket_inspect_errors_total", "sluice_queued_requests", "sluice_bucket_queued_requests", "sluice_bucket_wait_seconds"); err != nil {
		t.Error(err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("scrape took %v with Redis down, want about 1 s at most", d)
	}
}

// statsFunc is a StatsReader a test controls.
type statsFunc func() sluice.Stats

func (f statsFunc) Stats() sluice.Stats { return f() }

// TestTrackFigures: each Stats field under its metric; figures a limiter
// does not use are left out until they are above 0, and permits held stay
// reported once seen (back to 0 included).
func TestTrackFigures(t *testing.T) {
	c := sluiceprometheus.New()
	var mu sync.Mutex
	s := sluice.Stats{Waiting: 3}
	c.Track("semaphore", "db", statsFunc(func() sluice.Stats { mu.Lock(); defer mu.Unlock(); return s }))
	names := []string{"sluice_queued_requests", "sluice_held_permits", "sluice_scheduler_steps_total", "sluice_scheduler_fenced_steps_total", "sluice_scheduler_errors_total", "sluice_reentries_total", "sluice_leases_lost_total", "sluice_local_share", "sluice_local_requests_total"}
	if err := testutil.CollectAndCompare(c, strings.NewReader(`
# HELP sluice_queued_requests Calls waiting to enter the limiter in this process now.
# TYPE sluice_queued_requests gauge
sluice_queued_requests{sluice_limiter_kind="semaphore",sluice_limiter_name="db"} 3
`), names...); err != nil {
		t.Error(err)
	}
	mu.Lock()
	s = sluice.Stats{Held: 4, Steps: 5, Fenced: 6, Errors: 7, Reentries: 8, LeasesLost: 9, Local: true, LocalGranted: 10}
	mu.Unlock()
	if n := testutil.CollectAndCount(c, names...); n != len(names) {
		t.Errorf("%d figures, want %d", n, len(names))
	}
	for name, want := range map[string]float64{"sluice_held_permits": 4, "sluice_scheduler_steps_total": 5, "sluice_scheduler_fenced_steps_total": 6, "sluice_scheduler_errors_total": 7, "sluice_reentries_total": 8, "sluice_leases_lost_total": 9, "sluice_local_share": 1, "sluice_local_requests_total": 10} {
		reg := prometheus.NewPedanticRegistry()
		reg.MustRegister(c)
		m := point(t, reg, name, map[string]string{"sluice_limiter_kind": "semaphore", "sluice_limiter_name": "db"})
		if v := m.GetGauge().GetValue() + m.GetCounter().GetValue(); v != want {
			t.Errorf("%s = %v, want %v", name, v, want)
		}
	}
	mu.Lock()
	s.Held = 0
	mu.Unlock()
	if err := testutil.CollectAndCompare(c, strings.NewReader(`
# HELP sluice_held_permits Weight this process holds now (semaphore, concurrency limiter).
# TYPE sluice_held_permits gauge
sluice_held_permits{sluice_limiter_kind="semaphore",sluice_limiter_name="db"} 0
`), "sluice_held_permits"); err != nil {
		t.Error(err)
	}
}

// TestObserveAttributes: a failure carries its reason; a grant that did
// not queue and was on time adds to no histogram.
func TestObserveAttributes(t *testing.T) {
	c := sluiceprometheus.New()
	c.Observe(sluice.Event{Limiter: "local.rate", Result: sluice.Granted, Wait: time.Millisecond})
	c.Observe(sluice.Event{Limiter: "local.rate", Result: sluice.Failed, Reason: "closed"})
	c.Observe(sluice.Event{Limiter: "local.rate", Result: sluice.Granted, Queued: true, Wait: 30 * time.Millisecond, Late: 2 * time.Millisecond})
	if err := testutil.CollectAndCompare(c, strings.NewReader(`
# HELP sluice_requests_total Calls that tried to enter a limiter, by result (and reason, when refused or failed) and lane.
# TYPE sluice_requests_total counter
sluice_requests_total{sluice_lane="",sluice_limiter_kind="local.rate",sluice_limiter_name="",sluice_reason="",sluice_result="granted"} 2
sluice_requests_total{sluice_lane="",sluice_limiter_kind="local.rate",sluice_limiter_name="",sluice_reason="closed",sluice_result="failed"} 1
`), "sluice_requests_total"); err != nil {
		t.Error(err)
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	for _, h := range []struct {
		name   string
		labels map[string]string
		want   uint64
	}{
		{"sluice_request_time_in_queue_seconds", map[string]string{"sluice_limiter_kind": "local.rate", "sluice_limiter_name": "", "sluice_result": "granted", "sluice_lane": ""}, 1},
		{"sluice_request_time_in_queue_seconds", map[string]string{"sluice_limiter_kind": "local.rate", "sluice_limiter_name": "", "sluice_result": "failed", "sluice_lane": ""}, 0},
		{"sluice_request_lateness_seconds", map[string]string{"sluice_limiter_kind": "local.rate", "sluice_limiter_name": ""}, 1},
	} {
		if m := point(t, reg, h.name, h.labels); m.GetHistogram().GetSampleCount() != h.want {
			t.Errorf("%s %v: %v, want %d samples", h.name, h.labels, m, h.want)
		}
	}
}

// TestShadowMetrics: a bucket in shadow mode's calls show only as
// sluice_shadow_wait_seconds, each with the wait it would have had.
func TestShadowMetrics(t *testing.T) {
	srv := redistest.New(t)
	c, reg := newRegistry(t)
	name := t.Name()
	b := newBucket(t, srv, bucket.Config{Name: name, Capacity: 2, RefillAmount: 1, RefillFrequency: time.Hour, Shadow: true, Observer: c})
	ctx := context.Background()
	for range 5 {
		if err := b.Enter(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "the 5 shadow calls heard back", func() bool { return b.Stats().Shadow == 5 })
	labels := map[string]string{"sluice_limiter_kind": "bucket", "sluice_limiter_name": name, "sluice_result": "granted", "sluice_reason": ""}
	m := point(t, reg, "sluice_shadow_wait_seconds", labels)
	if m == nil {
		t.Fatal("no sluice_shadow_wait_seconds series")
	}
	// 0, 0, then 1, 2 and 3 refills of an hour (a new bucket's refills
	// start 5 ms late): 6 hours, within a minute.
	if h := m.GetHistogram(); h.GetSampleCount() != 5 || h.GetSampleSum() < 6*3600-60 || h.GetSampleSum() > 6*3600+1 {
		t.Fatalf("sluice_shadow_wait_seconds: %d samples summing %.0fs, want 5 summing about 6 hours", h.GetSampleCount(), h.GetSampleSum())
	}
	if m := point(t, reg, "sluice_requests_total", map[string]string{"sluice_limiter_name": name}); m != nil {
		t.Fatalf("a shadow call counted in sluice_requests_total: %v", m)
	}
}
