package scheduler_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/scheduler"
)

// retimeSetup makes a bucket of capacity 2 that gains 1 token every 100
// ms, spends its burst on two callers, queues two more and runs one step
// with a lookahead that gives both their slots (100 and 200 ms on). It
// returns the queue, the entries queued, the slots granted so far and a
// function that runs one more such step.
func retimeSetup(t *testing.T, name string) (*queue.Queue, []string, []time.Time, func()) {
	t.Helper()
	return twoQueued(t, name, protocol.Policy{Capacity: 2, RefillAmount: 1, RefillFrequency: 100 * time.Millisecond}, 4, 250*time.Millisecond)
}

// twoQueued makes a bucket of policy p, has n callers arrive so that the
// burst serves all but two, and runs one step whose lookahead gives both
// queued callers their slots. It returns what retimeSetup does.
func twoQueued(t *testing.T, name string, p protocol.Policy, n int, lookahead time.Duration) (*queue.Queue, []string, []time.Time, func()) {
	t.Helper()
	srv := redistest.New(t)
	srv.RequireReal(t)
	rdb := srv.Client()
	t.Cleanup(func() { rdb.Close() })
	ps := []protocol.Policy{p}
	opt := queueio.Options{Lookahead: 20 * time.Millisecond, LockTTL: time.Second, Grace: 10 * time.Second, MaxLateness: 10 * time.Millisecond}
	q := newQ(rdb, "sluice", name, ps, opt)
	// The step looks further ahead than arrivals do, so that one step
	// gives both queued callers their slots.
	opt.Lookahead = lookahead
	stepper := newQ(rdb, "sluice", name, ps, opt)
	entries, slots := arrive(t, q, n)
	if len(entries) != 2 {
		t.Fatalf("%d callers queued, want 2", len(entries))
	}
	if err := rdb.Set(ctx, keysOf(q).Lock, "tok", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	if r, err := scheduler.Step(ctx, rdb, stepper, "tok"); err != nil || r.Scheduled != 2 {
		t.Fatalf("step scheduled %d (%v), want both", r.Scheduled, err)
	}
	step := func() {
		t.Helper()
		if err := rdb.Set(ctx, keysOf(q).Lock, "tok", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		if _, err := scheduler.Step(ctx, rdb, stepper, "tok"); err != nil {
			t.Fatal(err)
		}
	}
	return q, entries, slots, step
}

// arrive makes n callers arrive one after the other and returns the
// entries of those queued and the slots of those served at once.
func arrive(t *testing.T, q *queue.Queue, n int) (entries []string, slots []time.Time) {
	t.Helper()
	for i := range n {
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
	return entries, slots
}

// TestLateCallerStartsAtOnce: a caller that comes too late for its slot
// while the bucket is in debt (its token stayed in the bucket, unused,
// all along) starts at once with it: its grant moves from its slot to the
// retime's instant, ahead of the next caller's slot, which keeps its
// time; the slots granted in the end (its old one not among them) keep
// the bucket's promise.
func TestLateCallerStartsAtOnce(t *testing.T) {
	q, entries, slots, _ := retimeSetup(t, t.Name())
	late, err := q.Poll(ctx, entries[0], false)
	if err != nil || !late.Found || late.Room == "" {
		t.Fatalf("poll = %+v, %v: want the slot, with its room", late, err)
	}
	// Too late for it: 50 ms past the slot, before the next refill.
	time.Sleep(late.Delay + 50*time.Millisecond)
	r, err := q.Retime(ctx, late.Slot, late.Room, nil, "", false)
	if err != nil {
		t.Fatal(err)
	}
	if !r.Refunded || r.Delay != 0 || r.Slot < late.Slot+50_000 {
		t.Fatalf("retime = %+v (missed slot %d): want to start now with the token, unused in a bucket in debt throughout", r, late.Slot)
	}
	other, err := q.Poll(ctx, entries[1], false)
	if err != nil || !(other.Found || other.Stale) { // stale: this test process was held up past it
		t.Fatalf("the other caller's poll = %+v, %v", other, err)
	}
	if other.Slot <= r.Slot {
		t.Fatalf("the next caller's slot %d, want after the late one's start %d, as the step gave it", other.Slot, r.Slot)
	}
	slots = append(slots, time.UnixMicro(r.Slot), time.UnixMicro(other.Slot))
	l := guarantee.Limit{Capacity: 2, RefillAmount: 1, RefillFrequency: 100 * time.Millisecond}
	if res := guarantee.Check(slots, l); !res.OK() {
		t.Fatalf("slots %v break the promise: %v", slots, res)
	}
}

// TestRetimeBeforeItsSlot: a caller that retimes before its slot (its
// clock, or its reckoning of Redis's, off) is not moved to now, which
// would start it on tokens the bucket does not have yet: it keeps its
// slot. (scheduler/TestGiveBacksKeepThePromise's seed 10 broke the
// promise by one, beside a busy loop, with a caller that retimed 10 ms
// before its slot and was moved to now.)
func TestRetimeBeforeItsSlot(t *testing.T) {
	q, entries, slots, _ := retimeSetup(t, t.Name())
	early, err := q.Poll(ctx, entries[0], false)
	if err != nil || !early.Found || early.Room == "" {
		t.Fatalf("poll = %+v, %v: want the slot, with its room", early, err)
	}
	r, err := q.Retime(ctx, early.Slot, early.Room, nil, "", false)
	if err != nil {
		t.Fatal(err)
	}
	if r.Now >= early.Slot {
		t.Skipf("this test process reached the retime %v after the slot: no retime before it to judge", time.Duration(r.Now-early.Slot)*time.Microsecond)
	}
	if r.Refunded || r.Claimed || r.Slot != early.Slot || r.Room != early.Room {
		t.Fatalf("retime %v before the slot = %+v: want the slot %d as it was (room %q)", time.Duration(early.Slot-r.Now)*time.Microsecond, r, early.Slot, early.Room)
	}
	slots = append(slots, time.UnixMicro(r.Slot))
	l := guarantee.Limit{Capacity: 2, RefillAmount: 1, RefillFrequency: 100 * time.Millisecond}
	if res := guarantee.Check(slots, l); !res.OK() {
		t.Fatalf("slots %v break the promise: %v", slots, res)
	}
}

// TestRetimeKeepsSpentWhenItCouldHaveFilled: a caller late by longer than
// the bucket takes to fill does not give its token back (the bucket without
// its grant would have lost refills to its capacity: giving it back could
// over-admit), yet it still gets the next slot.
func TestRetimeKeepsSpentWhenItCouldHaveFilled(t *testing.T) {
	q, entries, _, _ := retimeSetup(t, t.Name())
	late, err := q.Poll(ctx, entries[0], false)
	if err != nil || !late.Found {
		t.Fatalf("poll = %+v, %v", late, err)
	}
	time.Sleep(late.Delay + 400*time.Millisecond)
	r, err := q.Retime(ctx, late.Slot, late.Room, nil, "", false)
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
	r, err = q.Retime(ctx, 0, "", nil, "", false)
	if err != nil || r.Refunded {
		t.Fatalf("retime without a room = %+v, %v", r, err)
	}
}

// TestLateCallerStartsAtSaturation: at saturation a caller much later
// for its slot than the bucket's burst takes to refill (300 ms late on a
// bucket of 10 refilled every 20 ms) still starts at once with its
// token: the bucket's levels since its grant (the state's peaks) never
// came within its cost of the capacity, where counting every refill since
// (the bound before the peaks) says they could have. The grants in the
// end, the missed slot not among them and the late caller's start among
// them, keep the promise.
func TestLateCallerStartsAtSaturation(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	rdb := srv.Client()
	defer rdb.Close()
	// A capacity of 10 leaves the steps room: the bucket's level before a
	// step stays under 9 unless steps are 180 ms apart (a starved test
	// process), while counting every refill since would rule the
	// give-back out from 200 ms of lateness.
	ps := []protocol.Policy{{Capacity: 10, RefillAmount: 1, RefillFrequency: 20 * time.Millisecond}}
	q := newQ(rdb, "sluice", t.Name(), ps, queueio.Options{Lookahead: 20 * time.Millisecond, LockTTL: time.Minute, Grace: 10 * time.Second, MaxLateness: 10 * time.Millisecond})
	entries, slots := arrive(t, q, 40)
	if err := rdb.Set(ctx, keysOf(q).Lock, "tok", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	const lateOne = 15 // its slot comes ~300 ms in, well after the burst
	var late queueio.PollReply
	var foundAt time.Time
	retimed := false
	deadline := time.Now().Add(20 * time.Second)
	for next := 0; next < len(entries) || !retimed; {
		if time.Now().After(deadline) {
			t.Fatalf("only %d of %d callers scheduled in 20 s", next, len(entries))
		}
		if _, err := scheduler.Step(ctx, rdb, q, "tok"); err != nil {
			t.Fatal(err)
		}
		for next < len(entries) {
			r, err := q.Poll(ctx, entries[next], false)
			if err != nil {
				t.Fatal(err)
			}
			if !r.Found && !r.Stale {
				break // not scheduled yet
			}
			if next == lateOne {
				late, foundAt = r, time.Now() // it will not come for it
			} else {
				slots = append(slots, time.UnixMicro(r.Slot))
			}
			next++
		}
		if !retimed && !foundAt.IsZero() && time.Since(foundAt) > 300*time.Millisecond {
			r, err := q.Retime(ctx, late.Slot, late.Room, nil, "", false)
			if err != nil {
				t.Fatal(err)
			}
			if !r.Refunded || r.Delay != 0 {
				t.Fatalf("retime 300 ms late at saturation = %+v: want to start now with the token", r)
			}
			slots = append(slots, time.UnixMicro(r.Slot))
			retimed = true
		}
		time.Sleep(5 * time.Millisecond)
	}
	l := guarantee.Limit{Capacity: 10, RefillAmount: 1, RefillFrequency: 20 * time.Millisecond}
	if res := guarantee.Check(slots, l); !res.OK() {
		t.Fatalf("the grants break the promise: %v", res)
	}
}

// TestLateWithinAPeriodKeepsItsToken: on a bucket of capacity 1 at
// saturation (each grant takes the refill it waited for, so the levels
// before the grants reach the capacity and the peaks rule every move
// out), a caller 50 ms late for its slot, before the next refill, starts
// at once with its token when it reads its replies promptly (quiet): the
// bucket counted no refill since its slot, so the token only sat in it.
// Without quiet it takes the next slot, its token spent. The grants in
// the end keep the promise.
func TestLateWithinAPeriodKeepsItsToken(t *testing.T) {
	for _, quiet := range []bool{false, true} {
		t.Run(fmt.Sprint("quiet=", quiet), func(t *testing.T) {
			// Capacity 1, a token every 200 ms: one caller served at
			// once, two given slots 200 and 400 ms on.
			q, entries, slots, _ := twoQueued(t, t.Name(), protocol.Policy{Capacity: 1, RefillAmount: 1, RefillFrequency: 200 * time.Millisecond}, 3, 450*time.Millisecond)
			late, err := q.Poll(ctx, entries[0], false)
			if err != nil || !late.Found || late.Room == "" {
				t.Fatalf("poll = %+v, %v: want the slot, with its room", late, err)
			}
			next, err := q.Poll(ctx, entries[1], false)
			if err != nil || !next.Found {
				t.Fatalf("the next caller's poll = %+v, %v", next, err)
			}
			time.Sleep(late.Delay + 50*time.Millisecond)
			r, err := q.Retime(ctx, late.Slot, late.Room, nil, "", quiet)
			if err != nil {
				t.Fatal(err)
			}
			if r.Now < late.Slot {
				t.Fatalf("retime at %d, before the slot %d", r.Now, late.Slot)
			}
			// The next refill comes with the next caller's slot.
			inTime := r.Now < next.Slot
			switch {
			case quiet && inTime && (!r.Refunded || r.Delay != 0):
				t.Fatalf("retime %v late, before the next refill = %+v: want to start now with the token", time.Duration(r.Now-late.Slot)*time.Microsecond, r)
			case quiet && !inTime && r.Refunded:
				t.Fatalf("retime past the next refill (this test process was held up) = %+v: the token could have overflowed", r)
			case !quiet && r.Refunded:
				t.Fatalf("retime without quiet = %+v: want the next slot, the token spent (the peaks reach the capacity)", r)
			}
			if !inTime {
				t.Logf("the retime came %v after the slot, past the next refill", time.Duration(r.Now-late.Slot)*time.Microsecond)
			}
			slots = append(slots, time.UnixMicro(r.Slot), time.UnixMicro(next.Slot))
			if !r.Refunded {
				slots = append(slots, time.UnixMicro(late.Slot)) // its token was spent there
			}
			l := guarantee.Limit{Capacity: 1, RefillAmount: 1, RefillFrequency: 200 * time.Millisecond}
			if res := guarantee.Check(slots, l); !res.OK() {
				t.Fatalf("slots %v break the promise: %v", slots, res)
			}
		})
	}
}
