package bucket_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/testing/buckettest"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// heldBucket is a bucket whose one token is taken: every caller queues,
// its turn an hour or more away, and stays queued (no refill comes while
// a test runs).
func heldBucket(t testing.TB, lanes ...bucket.Lane) *bucket.Bucket {
	t.Helper()
	b := newBucket(t, redistest.New(t).Client(), bucket.Config{Capacity: 1, RefillAmount: 1, RefillFrequency: time.Hour, Lanes: lanes})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := b.Enter(ctx); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestInspectLanes: while callers wait in three named lanes and the
// default one, Inspect lists each lane with its callers, the most first,
// and a wait for a new caller of each that is Estimate's for that lane;
// the default lane's Wait is Estimate's without a lane. With the default
// lane alone, no lane is listed.
func TestInspectLanes(t *testing.T) {
	b := heldBucket(t, bucket.Lane{Name: "urgent", Priority: 1})
	ctx := withTimeout(t, 20*time.Second)

	buckettest.Queue(t, b, map[string]int{"": 1})
	in, err := b.Inspect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if in.Queued != 1 || len(in.Lanes) != 0 || in.OtherLanes != 0 || in.OtherQueued != 0 {
		t.Errorf("the default lane alone: Queued %d, Lanes %+v, other %d (%d callers); want 1 caller and no lane", in.Queued, in.Lanes, in.OtherLanes, in.OtherQueued)
	}

	buckettest.Queue(t, b, map[string]int{"a": 4, "b": 2, "urgent": 2})
	if in, err = b.Inspect(ctx); err != nil {
		t.Fatal(err)
	}
	want := []struct {
		name            string
		priority, count int
	}{{"a", 0, 4}, {"urgent", 1, 2}, {"b", 0, 2}, {"", 0, 1}}
	if in.Queued != 9 || len(in.Lanes) != len(want) || in.OtherLanes != 0 || in.OtherQueued != 0 {
		t.Fatalf("Queued %d, Lanes %+v, other %d (%d callers); want 9 callers in the lanes %v", in.Queued, in.Lanes, in.OtherLanes, in.OtherQueued, want)
	}
	for i, w := range want {
		l := in.Lanes[i]
		if l.Name != w.name || l.Priority != w.priority || l.Queued != w.count {
			t.Errorf("Lanes[%d] = %+v, want lane %q of priority %d with %d callers", i, l, w.name, w.priority, w.count)
		}
		lctx := ctx
		if l.Name != "" {
			lctx = bucket.WithLane(ctx, l.Name)
		}
		est, err := b.Estimate(lctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		// The slots are on the hour's refills: the two reads see the same
		// slot, Estimate a few ms closer to it.
		if d := l.Wait - est.Wait; d < 0 || d > time.Second {
			t.Errorf("lane %q: Inspect's wait %v, Estimate's %v", l.Name, l.Wait, est.Wait)
		}
	}
	// Lane a shares class 0 with b and the default lane: 5 turns of 3
	// lanes, 15 refills of an hour off; urgent is alone in class 1: 3.
	if a, u := in.Lanes[0].Wait, in.Lanes[1].Wait; a < 14*time.Hour || a > 15*time.Hour || u < 2*time.Hour || u > 3*time.Hour {
		t.Errorf("waits: lane a %v, want 14 to 15 h; lane urgent %v, want 2 to 3 h", a, u)
	}
	est, err := b.Estimate(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d := in.Wait - est.Wait; d < 0 || d > time.Second || in.Wait != in.Lanes[3].Wait {
		t.Errorf("Inspect's Wait %v, Estimate's without a lane %v, the default lane's row %v", in.Wait, est.Wait, in.Lanes[3].Wait)
	}
}

// TestInspectLanesCapped: with 25 named lanes and the default one with
// callers, Inspect lists the 20 with the most and sums the others'.
func TestInspectLanesCapped(t *testing.T) {
	b := heldBucket(t)
	lanes := map[string]int{"": 1}
	for i := range 25 {
		lanes[fmt.Sprintf("t%02d", i)] = 1 + min(i, 10)/5 // 5 lanes of 1, 5 of 2, 15 of 3
	}
	buckettest.Queue(t, b, lanes)
	in, err := b.Inspect(withTimeout(t, 10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if len(in.Lanes) != 20 || in.OtherLanes != 6 || in.OtherQueued != 6 || in.Queued != 1+5+10+45 {
		t.Fatalf("%d lanes listed, other %d lanes of %d callers, Queued %d; want 20, 6 lanes of 6, 61", len(in.Lanes), in.OtherLanes, in.OtherQueued, in.Queued)
	}
	for i, l := range in.Lanes {
		want := 3
		if i >= 15 {
			want = 2
		}
		if l.Queued != want || l.Name == "" {
			t.Errorf("Lanes[%d] = %+v, want a named lane of %d callers", i, l, want)
		}
	}
}

// BenchmarkInspectLanes: Inspect's cost while 1,000 lanes have one
// caller each; Redis time per Inspect is what lanes.lua adds.
func BenchmarkInspectLanes(b *testing.B) {
	bk := heldBucket(b)
	lanes := map[string]int{}
	for i := range 1000 {
		lanes[fmt.Sprintf("t%04d", i)] = 1
	}
	buckettest.Queue(b, bk, lanes)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := bk.Inspect(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
