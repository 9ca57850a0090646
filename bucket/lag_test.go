package bucket_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/enterdetail"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// refillLag is tokens.lua's refill_lag for the policies below: min(fill /
// 2, 5 ms), fill being the time from empty to full.
const refillLag = 5 * time.Millisecond

// TestRefillLagReserve: a Reserve that takes a full bucket below its
// capacity starts its refills the lag after its slot, on a new bucket and
// on one full again after idling (issue 31's reproduction: 1,000 tokens
// refilling 1 every 100 µs; Reserve 1,000, then 100): the second slot
// comes the lag plus the 10 ms of refills it needs after the first, so
// that an upstream that stayed full until the first request arrived, up
// to the lag late, has the 100 when the second arrives.
func TestRefillLagReserve(t *testing.T) {
	ctx := context.Background()
	srv := redistest.New(t)
	cfg := bucket.Config{Name: t.Name(), Policies: []bucket.Policy{
		{Unit: "tokens", Capacity: 1000, RefillAmount: 1, RefillFrequency: 100 * time.Microsecond},
	}}
	b := newBucket(t, clientOf(t, srv), cfg)
	reserve := func(n int) time.Time {
		t.Helper()
		var d enterdetail.Detail
		r, err := b.Reserve(enterdetail.With(ctx, &d), bucket.Cost{"tokens": n})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Settle(ctx, bucket.Cost{"tokens": n}); err != nil {
			t.Fatal(err)
		}
		if d.Slot.IsZero() {
			t.Fatal("no slot in the detail")
		}
		return d.Slot
	}
	var last time.Time // the last slot, a refill instant: refills come every 100 µs from it
	for _, what := range []string{"a new bucket", "a bucket full again after idling"} {
		if what != "a new bucket" {
			time.Sleep(300 * time.Millisecond) // 100 ms refills it
			wantLevels(t, b, "after idling", 1000)
		}
		first := reserve(1000)
		second := reserve(100)
		want, why := refillLag+100*100*time.Microsecond, fmt.Sprintf("the lag %v + 10 ms", refillLag)
		if !last.IsZero() && first.Sub(last)%(100*time.Microsecond) == 0 {
			// A grant at a refill's very instant counts as one that
			// the refill filled the bucket for, and moves nothing
			// (tokens.lua's lag_shift; design.md, Choices): about 1
			// in 100 here, where this test failed beside a busy loop
			// before it allowed for it.
			want, why = 100*100*time.Microsecond, "10 ms, no lag (the first came at a refill's instant)"
		}
		if d := second.Sub(first); d != want {
			t.Errorf("%s: the second slot came %v after the first, want %s = %v", what, d, why, want)
		}
		last = second
	}
}

// TestRefillLagEnter: through the scheduler's step (one policy counting
// calls, whose step pops without take_at), a new bucket of 1 refilling 1
// every 20 ms starts its refills the lag after its first grant; the
// grants after it, each at the refill that fills the bucket, move
// nothing: 25 ms, then 20 ms apart.
func TestRefillLagEnter(t *testing.T) {
	ctx := context.Background()
	srv := redistest.New(t)
	cfg := bucket.Config{Name: t.Name(), Policies: []bucket.Policy{
		{Capacity: 1, RefillAmount: 1, RefillFrequency: 20 * time.Millisecond},
	}}
	b := newBucket(t, clientOf(t, srv), cfg)
	const n = 5
	type grant struct {
		slot  time.Time
		moved bool // late for its slot: its grant moved or took the next (a starved test process)
	}
	var (
		mu sync.Mutex
		gs []grant
		wg sync.WaitGroup
	)
	for range n {
		wg.Go(func() {
			rep, err := enterReport(ctx, b)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			gs = append(gs, grant{rep.Slot, rep.Retimes > 0})
			mu.Unlock()
		})
	}
	wg.Wait()
	if len(gs) != n {
		t.Fatalf("%d of %d callers entered", len(gs), n)
	}
	slices.SortFunc(gs, func(a, b grant) int { return a.slot.Compare(b.slot) })
	// The first grant finds the new bucket full: the next refill comes
	// the lag after it. The others come at the refills that fill it,
	// which move nothing: 20 ms apart, the bucket's full rate. A grant
	// whose caller came late is not where the step put it: the gaps on
	// either side of it are not judged.
	judged := 0
	for i := 1; i < n; i++ {
		if gs[i].moved || gs[i-1].moved {
			continue
		}
		judged++
		want := 20 * time.Millisecond
		if i == 1 {
			want += refillLag
		}
		if d := gs[i].slot.Sub(gs[i-1].slot); d != want {
			t.Errorf("slot %d came %v after the one before, want %v", i, d, want)
		}
	}
	if judged == 0 {
		t.Errorf("every caller came late for its slot: no gap judged")
	}
}
