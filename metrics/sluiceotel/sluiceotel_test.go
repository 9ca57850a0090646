package sluiceotel_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/testing/buckettest"
	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/internal/testing/testkit"
	"github.com/sluicehq/sluice/metrics/sluiceotel"
)

// tee keeps every event before handing it to the Observer under test, so
// the test can compare the metrics with what the limiter reported.
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

func (t *tee) count(keep func(sluice.Event) bool) int64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	var n int64
	for _, e := range t.events {
		if keep(e) {
			n++
		}
	}
	return n
}

func newReader(t *testing.T) (*sluiceotel.Observer, *sdkmetric.ManualReader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	o, err := sluiceotel.New(mp)
	if err != nil {
		t.Fatal(err)
	}
	return o, reader
}

func collect(t *testing.T, r *sdkmetric.ManualReader) metricdata.ResourceMetrics {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatalf("collect: %v", err)
	}
	return rm
}

func find(rm metricdata.ResourceMetrics, name string) (metricdata.Metrics, bool) {
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != sluiceotel.ScopeName {
			continue
		}
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// value is the figure of metric name under exactly the attributes kv: a
// sum's or gauge's value, a histogram's count. ok is false when there is
// no such point.
func value(rm metricdata.ResourceMetrics, name string, kv ...attribute.KeyValue) (v float64, ok bool) {
	m, found := find(rm, name)
	if !found {
		return 0, false
	}
	want := attribute.NewSet(kv...)
	switch d := m.Data.(type) {
	case metricdata.Sum[int64]:
		for _, p := range d.DataPoints {
			if p.Attributes.Equals(&want) {
				return float64(p.Value), true
			}
		}
	case metricdata.Gauge[int64]:
		for _, p := range d.DataPoints {
			if p.Attributes.Equals(&want) {
				return float64(p.Value), true
			}
		}
	case metricdata.Gauge[float64]:
		for _, p := range d.DataPoints {
			if p.Attributes.Equals(&want) {
				return p.Value, true
			}
		}
	case metricdata.Histogram[float64]:
		for _, p := range d.DataPoints {
			if p.Attributes.Equals(&want) {
				return float64(p.Count), true
			}
		}
	}
	return 0, false
}

func expect(t *testing.T, rm metricdata.ResourceMetrics, want float64, name string, kv ...attribute.KeyValue) {
	t.Helper()
	got, ok := value(rm, name, kv...)
	if !ok {
		t.Errorf("%s %v: no point, want %v", name, kv, want)
	} else if got != want {
		t.Errorf("%s %v = %v, want %v", name, kv, got, want)
	}
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
// scheduler's steps, as a real SDK reader collects them against a real
// Redis.
func TestBucketMetrics(t *testing.T) {
	srv := redistest.New(t)
	o, reader := newReader(t)
	rec := &tee{next: o}
	ctx, cancelAll := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancelAll()

	// Five grants at once, then two callers wait (a refill an hour away)
	// and a full queue refuses three more.
	name := t.Name()
	b := newBucket(t, srv, bucket.Config{Name: name, Capacity: 5, RefillAmount: 1, RefillFrequency: time.Hour, MaxQueue: 2, Observer: rec})
	stop, err := o.Track("bucket", name, b)
	if err != nil {
		t.Fatal(err)
	}
	stopQueue, err := o.TrackQueue(b)
	if err != nil {
		t.Fatal(err)
	}
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
	kind, bn := sluiceotel.KindKey.String("bucket"), sluiceotel.NameKey.String(name)
	granted, refused, canceled := sluiceotel.ResultKey.String("granted"), sluiceotel.ResultKey.String("refused"), sluiceotel.ResultKey.String("canceled")
	rm := collect(t, reader)
	expect(t, rm, 5, "sluice.requests", kind, bn, granted)
	expect(t, rm, 3, "sluice.requests", kind, bn, refused, sluiceotel.ReasonKey.String("queue_full"))
	expect(t, rm, 2, "sluice.queued_requests", kind, bn)
	expect(t, rm, 2, "sluice.bucket.queued_requests", kind, bn)
	if w, ok := value(rm, "sluice.bucket.wait", kind, bn); !ok || w < 59*60 {
		t.Errorf("sluice.bucket.wait = %v (%v), want about an hour: the refill that the third caller would wait for", w, ok)
	}
	if _, ok := value(rm, "sluice.held_permits", kind, bn); ok {
		t.Error("sluice.held_permits reported for a bucket, which holds none")
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
	rm = collect(t, reader)
	expect(t, rm, 2, "sluice.requests", kind, bn, canceled)
	expect(t, rm, 0, "sluice.queued_requests", kind, bn)
	expect(t, rm, 0, "sluice.bucket.queued_requests", kind, bn)
	expect(t, rm, 2, "sluice.request.time_in_queue", kind, bn, canceled)
	if n := rec.count(func(e sluice.Event) bool { return e.Queued && e.Result != sluice.Refused }); n != 2 {
		t.Errorf("%d events queued, want the 2 canceled callers", n)
	}
	if _, ok := value(rm, "sluice.request.time_in_queue", kind, bn, refused); ok {
		t.Error("time in queue recorded for refusals, which never waited")
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if err := stopQueue(); err != nil {
		t.Fatal(err)
	}
	rm = collect(t, reader)
	if _, ok := value(rm, "sluice.queued_requests", kind, bn); ok {
		t.Error("sluice.queued_requests still reported after stop")
	}
	if _, ok := value(rm, "sluice.bucket.queued_requests", kind, bn); ok {
		t.Error("sluice.bucket.queued_requests still reported after stop")
	}

	// Callers that queue and are granted in turn: time in the queue and
	// lateness as the events say, and the scheduler's steps.
	paced := t.Name() + "-paced"
	p := newBucket(t, srv, bucket.Config{Name: paced, Capacity: 1, RefillAmount: 1, RefillFrequency: 50 * time.Millisecond, Observer: rec})
	if _, err := o.Track("bucket", paced, p); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			if err := p.Enter(ctx); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	pn := sluiceotel.NameKey.String(paced)
	isPaced := func(e sluice.Event) bool { return e.Name == paced }
	queued := rec.count(func(e sluice.Event) bool { return isPaced(e) && e.Queued && e.Result == sluice.Granted })
	late := rec.count(func(e sluice.Event) bool { return isPaced(e) && e.Late > 0 && e.Result == sluice.Granted })
	if queued < 4 {
		t.Errorf("%d of 6 callers queued, want at least 4 with a token per 50 ms", queued)
	}
	rm = collect(t, reader)
	expect(t, rm, 6, "sluice.requests", kind, pn, granted)
	expect(t, rm, float64(queued), "sluice.request.time_in_queue", kind, pn, granted)
	if late > 0 {
		expect(t, rm, float64(late), "sluice.request.lateness", kind, pn)
	} else if _, ok := value(rm, "sluice.request.lateness", kind, pn); ok {
		t.Error("sluice.request.lateness reported, but no caller was late")
	}
	steps, ok := value(rm, "sluice.scheduler.steps", kind, pn)
	if after := p.Stats().Steps; !ok || steps < 1 || steps > float64(after) {
		t.Errorf("sluice.scheduler.steps = %v (%v), want between 1 and Stats().Steps read after, %d", steps, ok, after)
	}
	if m, _ := find(rm, "sluice.request.time_in_queue"); m.Unit != "s" {
		t.Errorf("time in queue unit %q, want s", m.Unit)
	}
}

// TestTrackQueueRedisDown: a collection while Redis is down reports no
// bucket-wide figure, returns the error, and does not hang; the figures of
// this process are still collected.
func TestTrackQueueRedisDown(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	o, reader := newReader(t)
	name := t.Name()
	b := newBucket(t, srv, bucket.Config{Name: name, Capacity: 1, RefillAmount: 1, RefillFrequency: time.Second, Observer: o})
	if _, err := o.Track("bucket", name, b); err != nil {
		t.Fatal(err)
	}
	if _, err := o.TrackQueue(b); err != nil {
		t.Fatal(err)
	}
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	var rm metricdata.ResourceMetrics
	start := time.Now()
	err := reader.Collect(context.Background(), &rm)
	if err == nil {
		t.Fatal("collect with Redis down: no error")
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("collect took %v with Redis down, want about 1 s at most", d)
	}
	kind, bn := sluiceotel.KindKey.String("bucket"), sluiceotel.NameKey.String(name)
	if _, ok := value(rm, "sluice.bucket.queued_requests", kind, bn); ok {
		t.Error("bucket-wide queue reported with Redis down")
	}
	expect(t, rm, 0, "sluice.queued_requests", kind, bn)
}

// statsFunc is a StatsReader a test controls.
type statsFunc func() sluice.Stats

func (f statsFunc) Stats() sluice.Stats { return f() }

// TestTrackFigures: each Stats field under its metric; figures a limiter
// does not use are left out until they are above 0, and permits held stay
// reported once seen (back to 0 included).
func TestTrackFigures(t *testing.T) {
	o, reader := newReader(t)
	var mu sync.Mutex
	s := sluice.Stats{Waiting: 3}
	if _, err := o.Track("semaphore", "db", statsFunc(func() sluice.Stats { mu.Lock(); defer mu.Unlock(); return s })); err != nil {
		t.Fatal(err)
	}
	kv := []attribute.KeyValue{sluiceotel.KindKey.String("semaphore"), sluiceotel.NameKey.String("db")}
	rm := collect(t, reader)
	expect(t, rm, 3, "sluice.queued_requests", kv...)
	for _, n := range []string{"sluice.held_permits", "sluice.scheduler.steps", "sluice.scheduler.fenced_steps", "sluice.scheduler.errors", "sluice.reentries", "sluice.leases_lost", "sluice.local_share", "sluice.local_requests"} {
		if _, ok := value(rm, n, kv...); ok {
			t.Errorf("%s reported while 0", n)
		}
	}
	mu.Lock()
	s = sluice.Stats{Held: 4, Steps: 5, Fenced: 6, Errors: 7, Reentries: 8, LeasesLost: 9, Local: true, LocalGranted: 10}
	mu.Unlock()
	rm = collect(t, reader)
	for n, want := range map[string]float64{"sluice.queued_requests": 0, "sluice.held_permits": 4, "sluice.scheduler.steps": 5, "sluice.scheduler.fenced_steps": 6, "sluice.scheduler.errors": 7, "sluice.reentries": 8, "sluice.leases_lost": 9, "sluice.local_share": 1, "sluice.local_requests": 10} {
		expect(t, rm, want, n, kv...)
	}
	mu.Lock()
	s.Held, s.Local = 0, false
	mu.Unlock()
	rm = collect(t, reader)
	expect(t, rm, 0, "sluice.held_permits", kv...)
	expect(t, rm, 0, "sluice.local_share", kv...)
}

// TestObserveAttributes: a failure carries its reason; a grant that did
// not queue and was on time adds to no histogram.
func TestObserveAttributes(t *testing.T) {
	o, reader := newReader(t)
	o.Observe(sluice.Event{Limiter: "local.rate", Result: sluice.Granted, Wait: time.Millisecond})
	o.Observe(sluice.Event{Limiter: "local.rate", Result: sluice.Failed, Reason: "closed"})
	o.Observe(sluice.Event{Limiter: "local.rate", Result: sluice.Granted, Queued: true, Wait: 30 * time.Millisecond, Late: 2 * time.Millisecond})
	kind, noName := sluiceotel.KindKey.String("local.rate"), sluiceotel.NameKey.String("")
	rm := collect(t, reader)
	expect(t, rm, 2, "sluice.requests", kind, noName, sluiceotel.ResultKey.String("granted"))
	expect(t, rm, 1, "sluice.requests", kind, noName, sluiceotel.ResultKey.String("failed"), sluiceotel.ReasonKey.String("closed"))
	expect(t, rm, 1, "sluice.request.time_in_queue", kind, noName, sluiceotel.ResultKey.String("granted"))
	expect(t, rm, 1, "sluice.request.lateness", kind, noName)
	m, _ := find(rm, "sluice.request.time_in_queue")
	if h := m.Data.(metricdata.Histogram[float64]); h.DataPoints[0].Sum != 0.03 {
		t.Errorf("time in queue sum %v s, want 0.03", h.DataPoints[0].Sum)
	}
}

// TestShadowMetrics: a bucket in shadow mode's calls show only as
// sluice.shadow_wait, one point a call, with the wait it would have had.
func TestShadowMetrics(t *testing.T) {
	srv := redistest.New(t)
	o, reader := newReader(t)
	name := t.Name()
	b := newBucket(t, srv, bucket.Config{Name: name, Capacity: 2, RefillAmount: 1, RefillFrequency: time.Hour, Shadow: true, Observer: o})
	ctx := context.Background()
	for range 5 {
		if err := b.Enter(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 10*time.Second, "the 5 shadow calls heard back", func() bool { return b.Stats().Shadow == 5 })
	rm := collect(t, reader)
	m, ok := find(rm, "sluice.shadow_wait")
	if !ok {
		t.Fatal("no sluice.shadow_wait")
	}
	h := m.Data.(metricdata.Histogram[float64])
	if len(h.DataPoints) != 1 {
		t.Fatalf("%d series, want 1", len(h.DataPoints))
	}
	// 0, 0, then 1, 2 and 3 refills of an hour: 6 hours, within a minute.
	if p := h.DataPoints[0]; p.Count != 5 || p.Sum < 6*3600-60 || p.Sum > 6*3600+1 {
		t.Fatalf("sluice.shadow_wait: %d points summing %.0fs, want 5 summing about 6 hours", p.Count, p.Sum)
	}
	if _, ok := value(rm, "sluice.requests", sluiceotel.KindKey.String("bucket"), sluiceotel.NameKey.String(name), sluiceotel.ResultKey.String("granted")); ok {
		t.Fatal("a shadow call counted in sluice.requests")
	}
}
