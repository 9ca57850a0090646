package scheduler_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/scheduler"
)

// TestClaimSwapsSlots: three callers given slots 30 ms apart; the first
// does not come for its slot (its process stopped). Once it is 8 ms
// past, the third, polling for its own later slot, is given the first's
// slot instead (Claimed), and the first, when it comes, finds the
// third's slot (Swapped): the two grants keep their instants. Through the
// poll script (through a client that is not one server's, as on Cluster:
// a direct poll, TIME and GETDEL, claims nothing).
func TestClaimSwapsSlots(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	eachPoll(t, rdb, []bool{false}, func(t *testing.T, s queueio.Client, _ bool) {
		// MaxLateness 100 ms: claims from 3 ms (protocol.ClaimAfter) to
		// 80 ms after a slot (older ones only by a move, which a full
		// bucket refuses), by a caller whose own slot is later.
		q, ids, want := stepped(t, rdb, s, protocol.Policy{Capacity: 1, RefillAmount: 1, RefillFrequency: 30 * time.Millisecond},
			queueio.Options{Lookahead: time.Second, LockTTL: time.Second, Grace: 10 * time.Second, MaxLateness: 100 * time.Millisecond}, 3)
		// Wait until the first slot is 8 ms past, the third's still
		// ahead.
		deadline := time.Now().Add(5 * time.Second)
		for {
			now, err := rdb.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			if d := now.UnixMicro() - want[0]; d >= 8000 {
				if now.UnixMicro() >= want[2] {
					t.Skipf("the test process came %v after the first slot, the third's slot past: nothing to judge", time.Duration(d)*time.Microsecond)
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the Redis clock never passed the slot")
			}
			time.Sleep(time.Millisecond)
		}
		p, err := q.Poll(ctx, ids[2], false)
		if err != nil || !p.Found || !p.Claimed || p.Slot != want[0] {
			t.Fatalf("the third caller's poll: %+v %v, want the first's slot %d, claimed", p, err, want[0])
		}
		// The second comes for its own (before the first comes).
		p, err = q.Poll(ctx, ids[1], false)
		if err != nil || p.Claimed || p.Swapped || p.Slot != want[1] {
			t.Fatalf("the second caller's poll: %+v %v, want its own slot %d", p, err, want[1])
		}
		p, err = q.Poll(ctx, ids[0], false)
		if err != nil || !(p.Found || p.Stale) || !p.Swapped || p.Claimed || p.Slot != want[2] {
			t.Fatalf("the first caller's poll: %+v %v, want the third's slot %d, swapped", p, err, want[2])
		}
	})
}

// TestQueuedCallerTakesSlot: two callers queued, the first given its slot
// and not coming for it (its process stopped). Once it is 55 ms past, the
// second, still queued and polling, takes it (Claimed) and leaves the
// queue (550 ms past, with a MaxLateness of 1 s); the first, when it comes, finds its slot taken (Stale, no room:
// its tokens are not its to move) and is served as a caller too late for
// it. The grants judged by the checker: the taken slot once, the first
// caller's next one.
func TestQueuedCallerTakesSlot(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	eachPoll(t, rdb, []bool{true, false}, func(t *testing.T, s queueio.Client, _ bool) {
		// MaxLateness 1 s: claims as they are from 500 ms to 800 ms
		// after a slot (wide, so that a test process held up by a
		// busy host still polls inside it); a lookahead of 5 ms gives
		// the first caller its slot and leaves the second queued.
		l := protocol.Policy{Capacity: 1, RefillAmount: 1, RefillFrequency: 10 * time.Millisecond}
		q := newQ(s, "sluice", t.Name(), []protocol.Policy{l},
			queueio.Options{Lookahead: 5 * time.Millisecond, LockTTL: time.Second, Grace: 10 * time.Second, MaxLateness: time.Second})
		ids := enqueueN(t, rdb, q, 2)
		takeLock(t, rdb, q, "tok")
		if r, err := scheduler.Step(ctx, rdb, q, "tok"); err != nil || r.Scheduled != 1 {
			t.Fatalf("step: %+v %v", r, err)
		}
		first := slotsOf(t, rdb, q, ids[:1])[0]
		var late int64
		deadline := time.Now().Add(5 * time.Second)
		for {
			now, err := rdb.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			if late = now.UnixMicro() - first; late >= 550_000 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the Redis clock never passed the slot")
			}
			time.Sleep(time.Millisecond)
		}
		p, err := q.Poll(ctx, ids[1], false)
		if err != nil || !p.Found || !p.Claimed {
			t.Fatalf("the queued caller's poll: %+v %v, want the first's slot, claimed", p, err)
		}
		if late <= 750_000 && p.Slot != first {
			// Older than 800 ms, the claim moves the grant to now.
			t.Fatalf("the queued caller's slot %d, want the first's %d as it was", p.Slot, first)
		}
		if n, err := rdb.LLen(ctx, keysOf(q).Queue).Result(); err != nil || n != 0 {
			t.Fatalf("queue length %d %v after the claim, want 0: the claimer left it", n, err)
		}
		a, err := q.Poll(ctx, ids[0], false)
		if err != nil || !a.Stale || a.Found || a.Room != "" || a.Slot != first {
			t.Fatalf("the first caller's poll: %+v %v, want its slot %d, stale and without a room", a, err, first)
		}
		r, err := q.Retime(ctx, a.Slot, a.Room, nil, "", false)
		if err != nil || r.Refunded || r.Claimed {
			t.Fatalf("the first caller's retime: %+v %v, want the next slot", r, err)
		}
		slots := []time.Time{time.UnixMicro(p.Slot), time.UnixMicro(r.Slot)}
		if res := guarantee.Check(slots, guarantee.Limit{Capacity: 1, RefillAmount: 1, RefillFrequency: 10 * time.Millisecond}); !res.OK() {
			t.Fatalf("grants %v break the promise: %v", slots, res)
		}
	})
}

// TestRetimeWritesNextSlot: a late caller whose tokens cannot move and
// who finds no slot to claim, with the next slot further off than the
// lead, is not told that slot: it is written as a step writes one (its
// key under the entry the caller named, the due set), so that a running
// caller could claim it should this one's process stop again; the
// caller's poll finds it. Without an ID it is told the slot at once.
func TestRetimeWritesNextSlot(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	// Slots 100 ms apart and MaxLateness 1 s (claims from 500 ms after a
	// slot): a test process held up for most of 400 ms still finds the
	// next slot ahead and nothing to claim.
	q, ids, slots := stepped(t, rdb, rdb, protocol.Policy{Capacity: 1, RefillAmount: 1, RefillFrequency: 100 * time.Millisecond},
		queueio.Options{Lookahead: time.Second, LockTTL: time.Second, Grace: 10 * time.Second, MaxLateness: time.Second, Lead: 2 * time.Millisecond}, 4)
	if _, err := q.Poll(ctx, ids[0], false); err != nil {
		t.Fatal(err)
	}
	// No room: its tokens stay spent (a slot given at arrival).
	r, err := q.Retime(ctx, slots[0], "", nil, "again-0", false)
	if err != nil || r.Entry != protocol.MakeEntry("again-0", 0, "") || r.Refunded || r.Claimed || r.Room != "" || r.Slot < slots[3]+100_000 {
		t.Fatalf("retime: %+v %v, want the slot after the last given (%d), written for again-0", r, err, slots[3])
	}
	if score, err := rdb.ZScore(ctx, strings.TrimSuffix(keysOf(q).Queue, "queue")+"due", r.Entry).Result(); err != nil || int64(score) != r.Slot {
		t.Fatalf("the due set has %v %v for the entry, want its slot %d", score, err, r.Slot)
	}
	p, err := q.Poll(ctx, r.Entry, false)
	if err != nil || !p.Found || p.Slot != r.Slot || p.Room == "" {
		t.Fatalf("the poll of the caller retimed: %+v %v, want its slot %d with its room", p, err, r.Slot)
	}
	got := []time.Time{time.UnixMicro(slots[0]), time.UnixMicro(slots[1]), time.UnixMicro(slots[2]), time.UnixMicro(slots[3]), time.UnixMicro(p.Slot)}
	if res := guarantee.Check(got, guarantee.Limit{Capacity: 1, RefillAmount: 1, RefillFrequency: 100 * time.Millisecond}); !res.OK() {
		t.Fatalf("grants %v break the promise: %v", got, res)
	}
	// Without an ID: the next slot, told at once.
	n, err := q.Retime(ctx, slots[1], "", nil, "", false)
	if err != nil || n.Entry != "" || n.Slot <= p.Slot {
		t.Fatalf("retime without an ID: %+v %v, want the next slot after %d", n, err, p.Slot)
	}
}

// TestClaimsSkipOwnHandle: callers of one handle (their IDs share its
// prefix, up to the first '.') run in one process, so one that polls
// does not take the slot of another that has not come yet: it is only
// slower. The first keeps its slot, late as it is.
func TestClaimsSkipOwnHandle(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	l := protocol.Policy{Capacity: 1, RefillAmount: 1, RefillFrequency: 10 * time.Millisecond}
	q := newQ(scriptOnly{rdb}, "sluice", t.Name(), []protocol.Policy{l},
		queueio.Options{Lookahead: 5 * time.Millisecond, LockTTL: time.Second, Grace: 10 * time.Second, MaxLateness: 100 * time.Millisecond})
	// Both queued, the first given its slot by a step.
	entries := queuedAll(t, rdb, q, "handle1.a", "handle1.b")
	takeLock(t, rdb, q, "tok")
	if r, err := scheduler.Step(ctx, rdb, q, "tok"); err != nil || r.Scheduled != 1 {
		t.Fatalf("step: %+v %v", r, err)
	}
	first, err := rdb.Get(ctx, slotKey(q, "handle1.a")).Result()
	if err != nil {
		t.Fatal(err)
	}
	slot, _, _ := protocol.ParseSlotValue(first)
	deadline := time.Now().Add(5 * time.Second)
	for {
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if now.UnixMicro()-slot >= 55000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the Redis clock never passed the slot")
		}
		time.Sleep(time.Millisecond)
	}
	p, err := q.Poll(ctx, entries[1], false)
	if err != nil || p.Claimed || (p.Found && p.Slot == slot) {
		t.Fatalf("the second caller's poll: %+v %v, want no claim of its own handle's slot %d", p, err, slot)
	}
	if v, err := rdb.Get(ctx, slotKey(q, "handle1.a")).Result(); err != nil || v != first {
		t.Fatalf("the first caller's slot key holds %q %v, want %q untouched", v, err, first)
	}
}

// TestQueuedCallerTakesFreeTokens: the books have held tokens nobody was
// given for longer than the claim window's near end (protocol.ClaimAfter):
// the callers at the head of the queue, whose turn has come, did not
// come (a caller that runs when its turn has come gives the slots due
// itself), nor did a scheduler. A queued caller of another handle, whose
// own turn is further off, takes one now and leaves the queue; the
// callers it overtook keep their places. Not from its own handle's
// head, and not from tokens free for less than the window. The grants
// (the taken one, then the others' by a step) judged by the checker.
func TestQueuedCallerTakesFreeTokens(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	// 100/s; MaxLateness 100 ms: tokens free for 3 ms or more (one
	// more grant's: 10 ms) are taken. Ten callers queued ahead, more
	// than the tokens.
	queued := func(t *testing.T, s queueio.Client, capacity int64, head string) (*queue.Queue, []string) {
		l := protocol.Policy{Capacity: capacity, RefillAmount: 1, RefillFrequency: 10 * time.Millisecond}
		q := newQ(s, "sluice", t.Name(), []protocol.Policy{l},
			queueio.Options{Lookahead: 5 * time.Millisecond, LockTTL: time.Second, Grace: 10 * time.Second, MaxLateness: 100 * time.Millisecond})
		ids := make([]string, 11)
		for i := range 10 {
			ids[i] = fmt.Sprintf("%s.%d", head, i)
		}
		ids[10] = "mine.x"
		return q, queuedAll(t, rdb, q, ids...)
	}
	eachPoll(t, rdb, []bool{true, false}, func(t *testing.T, s queueio.Client, _ bool) {
		// A full bucket of 8: one grant's tokens free for 70 ms.
		q, entries := queued(t, s, 8, "other")
		p, err := q.Poll(ctx, entries[10], false)
		if err != nil || !p.Found || !p.Claimed || p.Delay > 0 {
			t.Fatalf("the queued caller's poll: %+v %v, want tokens taken now (found, claimed)", p, err)
		}
		if n, err := rdb.LLen(ctx, keysOf(q).Queue).Result(); err != nil || n != 10 {
			t.Fatalf("queue length %d %v, want the 10 overtaken still queued", n, err)
		}
		if head, err := rdb.LIndex(ctx, keysOf(q).Queue, 0).Result(); err != nil || head != entries[0] {
			t.Fatalf("queue head %q %v, want %q", head, err, entries[0])
		}
		takeLock(t, rdb, q, "tok")
		var grants []time.Time
		grants = append(grants, time.UnixMicro(p.Slot))
		deadline := time.Now().Add(5 * time.Second)
		for given := 0; given < 10; {
			r, err := scheduler.Step(ctx, rdb, q, "tok")
			if err != nil {
				t.Fatal(err)
			}
			given += r.Scheduled
			if time.Now().After(deadline) {
				t.Fatalf("%d of the 10 overtaken given a slot in 5 s", given)
			}
			time.Sleep(5 * time.Millisecond)
		}
		for _, sl := range slotsOf(t, rdb, q, entries[:10]) {
			grants = append(grants, time.UnixMicro(sl))
		}
		if res := guarantee.Check(grants, guarantee.Limit{Capacity: 8, RefillAmount: 1, RefillFrequency: 10 * time.Millisecond}); !res.OK() {
			t.Fatalf("grants %v break the promise: %v", grants, res)
		}
	})
	for _, c := range []struct {
		name     string
		capacity int64
		head     string
	}{
		{"own handle ahead", 8, "mine"},
		{"free too shortly", 1, "other"}, // the head's own token only: it may yet come
	} {
		t.Run(c.name, func(t *testing.T) {
			q, entries := queued(t, rdb, c.capacity, c.head)
			p, err := q.Poll(ctx, entries[10], false)
			if err != nil || p.Found || p.Claimed || p.Position != 11 {
				t.Fatalf("the queued caller's poll: %+v %v, want still queued at 11", p, err)
			}
		})
	}
}

// queuedAll queues callers ids, in order, all of them (behind a
// placeholder, taken out after: an arrival on an empty queue could be
// granted at once), and returns their entries.
func queuedAll(t *testing.T, rdb *redis.Client, q *queue.Queue, ids ...string) []string {
	t.Helper()
	if err := rdb.RPush(ctx, keysOf(q).Queue, "placeholder").Err(); err != nil {
		t.Fatal(err)
	}
	var entries []string
	for _, id := range ids {
		a, err := enqueueOne(q, id)
		if err != nil || kindOf(a) != kQueued {
			t.Fatalf("enqueue %s: %+v %v, want queued", id, a, err)
		}
		entries = append(entries, a.Entry)
	}
	if err := rdb.LRem(ctx, keysOf(q).Queue, 1, "placeholder").Err(); err != nil {
		t.Fatal(err)
	}
	return entries
}
