package scheduler_test

import (
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testing/guarantee"
	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/queue"
)

// TestLeaverPassesItsSlotOn: callers that leave after the step wrote their
// slots (one after its poll read it, one before) pass their tokens on: the
// next caller to arrive is given them, where without them it would wait
// two more refills, and the slots granted in the end (the two given up not
// among them) keep the bucket's promise.
func TestLeaverPassesItsSlotOn(t *testing.T) {
	q, entries, slots := retimeSetup(t, t.Name()) // burst of 2 at once, slots at 100 and 200 ms given
	read, err := q.Poll(ctx, entries[0])
	if err != nil || !read.Found || read.Room == "" {
		t.Fatalf("poll = %+v, %v: want the slot, with its room", read, err)
	}
	// The first leaves after reading its slot (its deadline comes before
	// it), the second before its poll: the slot key still holds its room.
	if err := q.Cancel(ctx, queue.Leaver{Entry: entries[0], Room: read.Room}, queue.Leaver{Entry: entries[1]}); err != nil {
		t.Fatal(err)
	}
	a, err := enqueueOne(q, "next")
	if err != nil {
		t.Fatal(err)
	}
	// Both tokens back: the bucket is as if the two had never been given
	// slots, so the next caller's slot is the first of them (100 ms after
	// the burst), not a third refill on.
	next := a.Slot
	if a.Entry != "" {
		next = a.Delay.Microseconds() + a.Now
	}
	if first := slots[0].Add(150 * time.Millisecond); time.UnixMicro(next).After(first) {
		t.Fatalf("the next caller's slot %v is more than 150 ms after the burst (%v): the slots given up were not passed on", time.UnixMicro(next), slots[0])
	}
	slots = append(slots, time.UnixMicro(next))
	l := guarantee.Limit{Capacity: 2, RefillAmount: 1, RefillFrequency: 100 * time.Millisecond}
	if res := guarantee.Check(slots, l); !res.OK() {
		t.Fatalf("slots %v break the promise: %v", slots, res)
	}
	// A caller who leaves a second time, or whose slot key is gone
	// without a room, passes nothing on twice.
	if err := q.Cancel(ctx, queue.Leaver{Entry: entries[1]}); err != nil {
		t.Fatal(err)
	}
	b, err := enqueueOne(q, "after")
	if err != nil {
		t.Fatal(err)
	}
	after := b.Now + b.Delay.Microseconds()
	if after-next < 100_000 {
		t.Fatalf("a second caller's slot %v is within a refill of the first's %v: a token passed on twice", time.UnixMicro(after), time.UnixMicro(next))
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
	q := newQ(rdb, "sluice", t.Name(), []queue.Policy{{Capacity: 1, RefillAmount: 1, RefillFrequency: 100 * time.Millisecond}},
		queue.Options{Lookahead: 20 * time.Millisecond, LockTTL: time.Second, Grace: 10 * time.Second, MaxLateness: 10 * time.Millisecond})
	if a, err := enqueueOne(q, "first"); err != nil || a.Entry != "" || a.Err != nil {
		t.Fatalf("first = %+v, %v: want its token at once", a, err) // the bucket is now empty for 100 ms
	}
	rs, err := q.Enqueue(ctx, []string{"hurried", "patient", "later"}, nil, []time.Duration{50 * time.Millisecond, 0, time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(rs[0].Err, queue.ErrWaitTooLong) || rs[0].Delay < 50*time.Millisecond || rs[0].Ticket != 0 {
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
