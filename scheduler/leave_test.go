package scheduler_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/queue"
)

// TestLeaverPassesItsSlotOn: callers that leave after the step wrote
// their slots (one after its poll read it, one before) pass their slots
// to the next callers in line, as they are: those find them at their
// first poll, at the very instants the step gave, so the grants keep the
// promise by construction; a slot passed on once is not passed on again.
func TestLeaverPassesItsSlotOn(t *testing.T) {
	q, entries, slots, _ := retimeSetup(t, t.Name()) // burst of 2 at once, slots at 100 and 200 ms given
	var next []string
	for i := range 3 {
		a, err := enqueueOne(q, fmt.Sprint("next", i))
		if err != nil || a.Entry == "" {
			t.Fatalf("next caller %d = %+v, %v: want queued", i, a, err)
		}
		next = append(next, a.Entry)
	}
	read, err := q.Poll(ctx, entries[0], false)
	if err != nil || !read.Found || read.Room == "" {
		t.Fatalf("poll = %+v, %v: want the slot, with its room", read, err)
	}
	// The first leaves after reading its slot (its deadline comes before
	// it), the second before its poll: the slot key still holds it.
	if err := q.Cancel(ctx, queue.Leaver{Entry: entries[0], Room: read.Room, Slot: read.Slot}, queue.Leaver{Entry: entries[1]}); err != nil {
		t.Fatal(err)
	}
	var got []int64
	for _, e := range next[:2] {
		r, err := q.Poll(ctx, e, false)
		if err != nil || !r.Found {
			t.Fatalf("poll of %s = %+v, %v: want the slot passed on", e, r, err)
		}
		got = append(got, r.Slot)
	}
	if got[0] != read.Slot || got[1] <= got[0] {
		t.Fatalf("slots passed on %v, want %d then the second given-up slot, later", got, read.Slot)
	}
	for _, g := range got {
		slots = append(slots, time.UnixMicro(g))
	}
	l := guarantee.Limit{Capacity: 2, RefillAmount: 1, RefillFrequency: 100 * time.Millisecond}
	if res := guarantee.Check(slots, l); !res.OK() {
		t.Fatalf("slots %v break the promise: %v", slots, res)
	}
	// Nobody else got them: the third caller still waits, and leaving a
	// second time passes nothing on.
	if err := q.Cancel(ctx, queue.Leaver{Entry: entries[0], Room: read.Room, Slot: read.Slot}); err != nil {
		t.Fatal(err)
	}
	if r, err := q.Poll(ctx, next[2], false); err != nil || r.Found || r.Position != 1 {
		t.Fatalf("the third caller's poll = %+v, %v: want still first in the queue", r, err)
	}
}

// TestWaitOfItsOwnRefusedAtArrival: a caller whose own bound (its ctx's
// deadline) comes before its estimated slot is refused at once with the
// estimate, taking no place and no token; one whose bound covers it
// queues.
func TestWaitOfItsOwnRefusedAtArrival(t *testing.T) {
	srv := redistest.New(t)
	rdb := srv.Client()
	defer rdb.Close()
	// A Queue of its own, whose push lane is closed (it queued nobody
	// yet): the push lane cannot refuse, the script does.
	q := newQ(rdb, "sluice", t.Name(), []protocol.Policy{{Capacity: 1, RefillAmount: 1, RefillFrequency: 100 * time.Millisecond}},
		queueio.Options{Lookahead: 20 * time.Millisecond, LockTTL: time.Second, Grace: 10 * time.Second, MaxLateness: 10 * time.Millisecond})
	if a, err := enqueueOne(q, "first"); err != nil || a.Entry != "" || a.Err != nil {
		t.Fatalf("first = %+v, %v: want its token at once", a, err) // the bucket is now empty for 100 ms
	}
	rs, err := q.Enqueue(ctx, []string{"hurried", "patient", "later"}, nil, []time.Duration{50 * time.Millisecond, 0, time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(rs[0].Err, queueio.ErrWaitTooLong) || rs[0].Delay < 50*time.Millisecond || rs[0].Ticket != 0 {
		t.Fatalf("hurried = %+v: want refused, its estimate ~100 ms, no ticket", rs[0])
	}
	if rs[1].Entry == "" || rs[2].Entry == "" {
		t.Fatalf("patient = %+v, later = %+v: want both queued", rs[1], rs[2])
	}
	// The refused caller took no place: the next two have consecutive
	// positions from the front, and consecutive tickets.
	if rs[1].Position != 1 || rs[2].Position != 2 || rs[2].Ticket != rs[1].Ticket+1 {
		t.Fatalf("positions %d, %d, tickets %d, %d: want 1, 2 and consecutive", rs[1].Position, rs[2].Position, rs[1].Ticket, rs[2].Ticket)
	}
	if rs[1].Delay > 150*time.Millisecond {
		t.Fatalf("patient's estimate %v: the refused caller's token was counted", rs[1].Delay)
	}
}

// TestLeaverGivesItsTokensBack: a caller that leaves after the step wrote
// its slot, with nobody queued to take the slot, gives its token back to
// the bucket when that is exact (the bucket's levels since the step, its
// peaks, left room for it): the next caller to arrive gets the slot the
// bucket would have had without the grant, a refill earlier than it would
// have otherwise, and every grant in the end keeps the promise. Leaving a
// second time gives nothing back again (with two tokens back, the next
// caller would have the first's slot).
func TestLeaverGivesItsTokensBack(t *testing.T) {
	q, entries, slots, step := retimeSetup(t, t.Name()) // burst of 2 at once, slots at 100 and 200 ms given
	read, err := q.Poll(ctx, entries[0], false)
	if err != nil || !read.Found || read.Room == "" {
		t.Fatalf("poll = %+v, %v: want the slot, with its room", read, err)
	}
	second, err := q.Poll(ctx, entries[1], false)
	if err != nil || !second.Found {
		t.Fatalf("poll = %+v, %v: want the second slot", second, err)
	}
	slots = append(slots, time.UnixMicro(second.Slot))
	for range 2 { // the second time finds its slot key marked: nothing more goes back
		if err := q.Cancel(ctx, queue.Leaver{Entry: entries[0], Room: read.Room, Slot: read.Slot}); err != nil {
			t.Fatal(err)
		}
	}
	// The bucket holds the given-back token from the first slot on: the
	// next caller's slot is the second's (two tokens there), where it
	// would have been a refill after it.
	a, err := enqueueOne(q, "next")
	if err != nil || a.Entry == "" {
		t.Fatalf("next caller = %+v, %v: want queued", a, err)
	}
	step()
	r, err := q.Poll(ctx, a.Entry, false)
	if err != nil || !r.Found {
		t.Fatalf("next caller's poll = %+v, %v: want its slot", r, err)
	}
	if r.Slot != second.Slot {
		t.Fatalf("next caller's slot is %v after the second's, want the same", time.Duration(r.Slot-second.Slot)*time.Microsecond)
	}
	slots = append(slots, time.UnixMicro(r.Slot))
	l := guarantee.Limit{Capacity: 2, RefillAmount: 1, RefillFrequency: 100 * time.Millisecond}
	if res := guarantee.Check(slots, l); !res.OK() {
		t.Fatalf("slots %v break the promise: %v", slots, res)
	}
}
