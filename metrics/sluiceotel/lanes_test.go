package sluiceotel_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/testing/buckettest"
	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/metrics/sluiceotel"
)

// TestLaneAttributes: a bucket's calls in 25 lanes and the default one,
// read back through the SDK's reader: the first 20 lanes under their own
// names, the 5 past the bound under "other", the default lane without
// sluice.lane; a lane past the bound that then makes more than twice the
// calls of the least busy labelled lane takes its label, and that lane is
// no longer reported.
func TestLaneAttributes(t *testing.T) {
	srv := redistest.New(t)
	o, reader := newReader(t)
	name := t.Name()
	b := newBucket(t, srv, bucket.Config{Name: name, Capacity: 100, RefillAmount: 100, RefillFrequency: time.Hour, Observer: o})
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
	granted := []attribute.KeyValue{sluiceotel.KindKey.String("bucket"), sluiceotel.NameKey.String(name), sluiceotel.ResultKey.String("granted")}
	inLane := func(lane string) []attribute.KeyValue {
		return append(granted[:3:3], sluiceotel.LaneKey.String(lane))
	}
	for i := range 25 {
		enter(fmt.Sprintf("t%02d", i))
	}
	enter("")
	enter("")
	rm := collect(t, reader)
	for i := range 25 {
		lane := fmt.Sprintf("t%02d", i)
		v, ok := value(rm, "sluice.requests", inLane(lane)...)
		if want := i < 20; ok != want || (ok && v != 1) {
			t.Errorf("lane %s: %v granted (a point: %v), want a point of 1: %v", lane, v, ok, want)
		}
	}
	expect(t, rm, 5, "sluice.requests", inLane("other")...)
	expect(t, rm, 2, "sluice.requests", granted...)

	// t24 has 1 call, as has every labelled lane: its second is still
	// "other"; its third is more than twice theirs, and takes the label of
	// one of them (the last by name, t19).
	enter("t24")
	enter("t24")
	rm = collect(t, reader)
	expect(t, rm, 6, "sluice.requests", inLane("other")...)
	expect(t, rm, 1, "sluice.requests", inLane("t24")...)
	if v, ok := value(rm, "sluice.requests", inLane("t19")...); ok {
		t.Errorf("t19: %v granted, want no point: t24 took its label", v)
	}
	m, _ := find(rm, "sluice.requests")
	lanes := map[string]bool{}
	for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
		v, _ := p.Attributes.Value(sluiceotel.LaneKey)
		lanes[v.AsString()] = true
	}
	if len(lanes) != 22 { // 20 lanes, "other" and none (the default lane)
		t.Errorf("%d values of sluice.lane, want 22: %v", len(lanes), lanes)
	}
}

// TestTrackQueueLanes: TrackQueue reports each lane's callers queued and
// a new caller's wait from Redis, the lanes past WithTopLanes summed as
// "other" (with no wait); with no named lane waiting, no lane at all.
func TestTrackQueueLanes(t *testing.T) {
	srv := redistest.New(t)
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	t.Cleanup(func() { mp.Shutdown(context.Background()) })
	o, err := sluiceotel.New(mp, sluiceotel.WithTopLanes(2))
	if err != nil {
		t.Fatal(err)
	}
	name := t.Name()
	b := newBucket(t, srv, bucket.Config{Name: name, Capacity: 1, RefillAmount: 1, RefillFrequency: time.Hour})
	stop, err := o.TrackQueue(b)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stop() })
	if err := b.Enter(context.Background()); err != nil { // the one token: every caller below queues
		t.Fatal(err)
	}
	buckettest.Queue(t, b, map[string]int{"": 1})
	attrs := func(lane string) []attribute.KeyValue {
		kv := []attribute.KeyValue{sluiceotel.KindKey.String("bucket"), sluiceotel.NameKey.String(name)}
		if lane != "" {
			kv = append(kv, sluiceotel.LaneKey.String(lane))
		}
		return kv
	}
	if v, ok := value(collect(t, reader), "sluice.bucket.lane.queued_requests", attrs("")...); ok {
		t.Errorf("the default lane alone: %v, want no lane reported", v)
	}

	buckettest.Queue(t, b, map[string]int{"a": 3, "b": 2, "c": 1})
	rm := collect(t, reader)
	for lane, want := range map[string]float64{"a": 3, "b": 2, "": 1, "other": 1, "c": -1} {
		v, ok := value(rm, "sluice.bucket.lane.queued_requests", attrs(lane)...)
		if ok != (want >= 0) || (ok && v != want) {
			t.Errorf("lane %q: %v callers queued (a point: %v), want %v (-1: none)", lane, v, ok, want)
		}
		w, ok := value(rm, "sluice.bucket.lane.wait", attrs(lane)...)
		if hasWait := lane != "other" && lane != "c"; ok != hasWait || (ok && w < 3600) {
			t.Errorf("lane %q: wait %vs (a point: %v), want one of hours: %v", lane, w, ok, hasWait)
		}
	}
	// Lane a shares class 0 with b, c and the default lane: 4 turns of 4
	// lanes, 16 refills of an hour off.
	if w, _ := value(rm, "sluice.bucket.lane.wait", attrs("a")...); w < 15*3600 || w > 16*3600 {
		t.Errorf("lane a: a new caller would wait %vs, want 15 to 16 hours", w)
	}
}
