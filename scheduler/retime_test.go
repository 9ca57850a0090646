package scheduler_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testing/guarantee"
	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/scheduler"
)

// retimeSetup makes a bucket of capacity 2 that gains 1 token every 100
// ms, spends its burst on two callers, queues two more and runs one step
// with a lookahead that gives both their slots (100 and 200 ms on). It
// returns the queue, the entries queued and the slots granted so far.
func retimeSetup(t *testing.T, name string) (*queue.Queue, []string, []time.Time) {
	t.Helper()
	srv := redistest.New(t)
	srv.RequireReal(t)
	rdb := srv.Client()
	t.Cleanup(func() { rdb.Close() })
	ps := []queue.Policy{{Capacity: 2, RefillAmount: 1, RefillFrequency: 100 * time.Millisecond}}
	opt := queue.Options{Lookahead: 20 * time.Millisecond, LockTTL: time.Second, Grace: 10 * time.Second, MaxLateness: 10 * time.Millisecond}
	q := newQ(rdb, "sluice", name, ps, opt)
	// The step looks further ahead than arrivals do, so that one step
	// gives both queued callers their slots.
	opt.Lookahead = 250 * time.Millisecond
	stepper := newQ(rdb, "sluice", name, ps, opt)
	var slots []time.Time
	var entries []string
	for i := range 4 {
		a, err := enqueueOne(q, fmt.Sprint("c", i))
		if err != nil {
			t.Fatal(err)
		}
		if a.Entry != "" {
			entries = append(entries, a.Entry)
		} else {
			slots = append(slots, time.UnixMicro(a.Slot))
		}
	}
	if len(entries) != 2 {
		t.Fatalf("%d callers queued, want 2", len(entries))
	}
	if err := rdb.Set(ctx, q.Keys().Lock, "tok", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if r, err := scheduler.Step(ctx, rdb, stepper, "tok"); err != nil || r.Scheduled != 2 {
		t.Fatalf("step scheduled %d (%v), want both", r.Scheduled, err)
	}
	return q, entries, slots
}

// TestRetimeGivesTheTokenBack: a caller that comes too late for its slot
// while the bucket is in debt gives its token back and takes the next
// slot; the slots granted in the end (its old one not among them) keep
// the bucket's promise, and it took no more tokens than one.
func TestRetimeGivesTheTokenBack(t *testing.T) {
	q, entries, slots := retimeSetup(t, t.Name())
	late, err := q.Poll(ctx, entries[0])
	if err != nil || !late.Found || late.Room == "" {
		t.Fatalf("poll = %+v, %v: want the slot, with its room", late, err)
	}
	// Too late for it: 50 ms past the slot, before the next refill.
	time.Sleep(late.Delay + 50*time.Millisecond)
	r, err := q.Retime(ctx, late.Room, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Refunded {
		t.Fatalf("retime = %+v: the token did not go back, though the bucket was in debt throughout", r)
	}
	other, err := q.Poll(ctx, entries[1])
	if err != nil || !other.Found {
		t.Fatalf("the other caller's poll = %+v, %v", other, err)
	}
	slots = append(slots, time.UnixMicro(r.Slot), time.UnixMicro(other.Slot))
	l := guarantee.Limit{Capacity: 2, RefillAmount: 1, RefillFrequency: 100 * time.Millisecond}
	if res := guarantee.Check(slots, l); !res.OK() {
		t.Fatalf("slots %v break the promise: %v", slots, res)
	}
	// Given back and taken again: the caller got the slot after the
	// other's, not one more ahead of it (which would be a token too many
	// at 200 ms: two grants there need the token of 100 ms kept).
	if r.Slot < other.Slot {
		t.Errorf("retimed slot %v before the next caller's %v", time.UnixMicro(r.Slot), time.UnixMicro(other.Slot))
	}
}

// TestRetimeKeepsSpentWhenItCouldHaveFilled: a caller late by longer than
// the bucket takes to fill does not give its token back (the bucket without
// its grant would have lost refills to its capacity: giving it back could
// over-admit), yet it still gets the next slot.
func TestRetimeKeepsSpentWhenItCouldHaveFilled(t *testing.T) {
	q, entries, _ := retimeSetup(t, t.Name())
	late, err := q.Poll(ctx, entries[0])
	if err != nil || !late.Found {
		t.Fatalf("poll = %+v, %v", late, err)
	}
	time.Sleep(late.Delay + 400*time.Millisecond)
	r, err := q.Retime(ctx, late.Room, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Refunded {
		t.Fatalf("retime = %+v: gave the token back though the bucket may have filled since", r)
	}
	if r.Delay < 0 {
		t.Fatalf("retime gave a slot %v in the past", r.Delay)
	}
	// Without a room (a slot given at arrival) nothing goes back either.
	r, err = q.Retime(ctx, "", nil)
	if err != nil || r.Refunded {
		t.Fatalf("retime without a room = %+v, %v", r, err)
	}
}
