package sluiceprometheus_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/testing/buckettest"
	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/metrics/sluiceprometheus"
)

// requests is the count of sluice_requests_total granted by bucket name
// in lane, as the registry gathers it; -1 when there is no such series.
func requests(t *testing.T, reg prometheus.Gatherer, name, lane string) float64 {
	t.Helper()
	m := point(t, reg, "sluice_requests_total", map[string]string{"sluice_limiter_kind": "bucket", "sluice_limiter_name": name, "sluice_result": "granted", "sluice_reason": "", "sluice_lane": lane})
	if m == nil {
		return -1
	}
	return m.GetCounter().GetValue()
}

// TestLaneLabels: a bucket's calls in 25 lanes and the default one,
// gathered from a real registry: the first 20 lanes under their own
// names, the 5 past the bound under "other", the default lane under "";
// a lane past the bound that then makes more than twice the calls of the
// least busy labelled lane takes its label, and that lane's series goes.
func TestLaneLabels(t *testing.T) {
	srv := redistest.New(t)
	c, reg := newRegistry(t)
	name := t.Name()
	b := newBucket(t, srv, bucket.Config{Name: name, Capacity: 100, RefillAmount: 100, RefillFrequency: time.Hour, Observer: c})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	enter := func(lane string) {
		t.Helper()
		lctx := ctx
		if lane != "" {
			lctx = bucket.WithLane(ctx, lane)
		}
		if err := b.Enter(lctx); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 25 {
		enter(fmt.Sprintf("t%02d", i))
	}
	enter("")
	enter("")
	for i := range 25 {
		lane, want := fmt.Sprintf("t%02d", i), 1.0
		if i >= 20 {
			want = -1
		}
		if got := requests(t, reg, name, lane); got != want {
			t.Errorf("lane %s: %v granted, want %v (-1: no series)", lane, got, want)
		}
	}
	if got := requests(t, reg, name, "other"); got != 5 {
		t.Errorf("other: %v granted, want 5", got)
	}
	if got := requests(t, reg, name, ""); got != 2 {
		t.Errorf("the default lane: %v granted, want 2", got)
	}

	// t24 has 1 call, as has every labelled lane: its second is still
	// "other"; its third is more than twice theirs, and takes the label of
	// one of them (the last by name, t19).
	enter("t24")
	enter("t24")
	if got := requests(t, reg, name, "other"); got != 6 {
		t.Errorf("other: %v granted, want 6", got)
	}
	if got := requests(t, reg, name, "t24"); got != 1 {
		t.Errorf("t24: %v granted, want 1 under its own label", got)
	}
	if got := requests(t, reg, name, "t19"); got != -1 {
		t.Errorf("t19: %v granted, want no series: t24 took its label", got)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	lanes := map[string]bool{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == "sluice_lane" {
					lanes[lp.GetValue()] = true
				}
			}
		}
	}
	if len(lanes) != 22 { // 20 lanes, "other" and the default lane's ""
		t.Errorf("%d values of sluice_lane, want 22: %v", len(lanes), lanes)
	}
}

// TestTrackQueueLanes: TrackQueue reports each lane's callers queued and
// a new caller's wait from Redis, the lanes past WithTopLanes summed as
// "other" (with no wait); with no named lane waiting, no lane at all.
func TestTrackQueueLanes(t *testing.T) {
	srv := redistest.New(t)
	c := sluiceprometheus.New(sluiceprometheus.WithTopLanes(2))
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	name := t.Name()
	b := newBucket(t, srv, bucket.Config{Name: name, Capacity: 1, RefillAmount: 1, RefillFrequency: time.Hour})
	t.Cleanup(c.TrackQueue(b))
	if err := b.Enter(context.Background()); err != nil { // the one token: every caller below queues
		t.Fatal(err)
	}
	buckettest.Queue(t, b, map[string]int{"": 1})
	labels := func(lane string) map[string]string {
		return map[string]string{"sluice_limiter_kind": "bucket", "sluice_limiter_name": name, "sluice_lane": lane}
	}
	if m := point(t, reg, "sluice_bucket_lane_queued_requests", labels("")); m != nil {
		t.Errorf("the default lane alone: %v, want no lane reported", m)
	}

	buckettest.Queue(t, b, map[string]int{"a": 3, "b": 2, "c": 1})
	for lane, want := range map[string]float64{"a": 3, "b": 2, "": 1, "other": 1, "c": -1} {
		m := point(t, reg, "sluice_bucket_lane_queued_requests", labels(lane))
		if got := m.GetGauge().GetValue(); (m == nil && want >= 0) || (m != nil && got != want) {
			t.Errorf("lane %q: %v callers queued, want %v (-1: none reported)", lane, m, want)
		}
		w := point(t, reg, "sluice_bucket_lane_wait_seconds", labels(lane))
		if hasWait := lane != "other" && lane != "c"; (w != nil) != hasWait || (w != nil && w.GetGauge().GetValue() < 3600) {
			t.Errorf("lane %q: wait %v, want one of hours: %v", lane, w, hasWait)
		}
	}
	// Lane a shares class 0 with b, c and the default lane: 4 turns of 4
	// lanes, 16 refills of an hour off.
	if w := point(t, reg, "sluice_bucket_lane_wait_seconds", labels("a")).GetGauge().GetValue(); w < 15*3600 || w > 16*3600 {
		t.Errorf("lane a: a new caller would wait %vs, want 15 to 16 hours", w)
	}
}
