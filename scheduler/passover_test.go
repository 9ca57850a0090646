package scheduler_test

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/scheduler"
)

// TestStepPassesOverStoppedHandles: callers of handles a and b queued, a's
// first. a's first caller is given its slot and does not collect it (its
// process stopped). Once that slot is protocol.PassOver past, the steps
// give their slots to b's callers (whose process runs: they collect
// them) while a's keep their places at the head; with b's served, a's
// are given theirs, in arrival order. The checker judges every slot
// given.
func TestStepPassesOverStoppedHandles(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	l := protocol.Policy{Capacity: 1, RefillAmount: 1, RefillFrequency: 10 * time.Millisecond}
	q := newQ(scriptOnly{rdb}, "sluice", t.Name(), []protocol.Policy{l},
		queueio.Options{Lookahead: 5 * time.Millisecond, LockTTL: time.Second, Grace: 10 * time.Second, MaxLateness: 100 * time.Millisecond})
	ids := []string{"a.0", "a.1", "a.2", "b.0", "b.1"}
	entries := queuedAll(t, rdb, q, ids...)
	takeLock(t, rdb, q, "tok")
	step := func() int {
		t.Helper()
		r, err := scheduler.Step(ctx, rdb, q, "tok")
		if err != nil {
			t.Fatal(err)
		}
		return r.Scheduled
	}
	given := map[string]bool{}
	var bSlots []time.Time // collected by b's polls
	var order []string
	// Step until a.0 has its slot, then until it is PassOver past.
	deadline := time.Now().Add(5 * time.Second)
	for step() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no slot given in 5 s")
		}
		time.Sleep(time.Millisecond)
	}
	if n, _ := rdb.Exists(ctx, slotKey(q, "a.0")).Result(); n != 1 {
		t.Fatal("the first step gave a.0 no slot")
	}
	given["a.0"], order = true, append(order, "a.0")
	a0 := slotsOf(t, rdb, q, []string{"a.0"})[0]
	for {
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if now.UnixMicro() > a0+protocol.PassOver.Microseconds()+1000 {
			break
		}
		time.Sleep(time.Millisecond)
	}
	// The steps now: b's callers first.
	for len(order) < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("given %v in 5 s, want b's two callers next", order)
		}
		if step() > 0 {
			for i, id := range ids {
				if n, _ := rdb.Exists(ctx, slotKey(q, id)).Result(); n == 1 && !given[id] {
					given[id], order = true, append(order, id)
					if id[0] == 'b' {
						// b's process runs: its caller collects its slot.
						p, err := q.Poll(ctx, entries[i], false)
						if err != nil || !p.Found {
							t.Fatalf("%s's poll: %+v %v, want its slot", id, p, err)
						}
						bSlots = append(bSlots, time.UnixMicro(p.Slot))
					}
				}
			}
		}
		time.Sleep(time.Millisecond)
	}
	if order[1] != "b.0" || order[2] != "b.1" {
		t.Fatalf("slots given to %v, want b.0 and b.1 after a.0 (a passed over)", order)
	}
	if head, err := rdb.LIndex(ctx, keysOf(q).Queue, 0).Result(); err != nil || head != entries[1] {
		t.Fatalf("queue head %q %v, want a.1's entry %q: its place kept", head, err, entries[1])
	}
	// Nobody else queued: a's callers are served, in order.
	for len(order) < len(ids) {
		if time.Now().After(deadline) {
			t.Fatalf("given %v in 5 s, want a.1 and a.2 too", order)
		}
		step()
		for _, id := range ids {
			if n, _ := rdb.Exists(ctx, slotKey(q, id)).Result(); n == 1 && !given[id] {
				given[id], order = true, append(order, id)
			}
		}
		time.Sleep(time.Millisecond)
	}
	if order[3] != "a.1" || order[4] != "a.2" {
		t.Fatalf("slots given to %v, want a.1 then a.2 last", order)
	}
	grants := []time.Time{time.UnixMicro(a0)}
	for _, sl := range slotsOf(t, rdb, q, []string{"a.1", "a.2"}) {
		grants = append(grants, time.UnixMicro(sl))
	}
	grants = append(grants, bSlots...)
	if res := guarantee.Check(grants, guarantee.Limit{Capacity: 1, RefillAmount: 1, RefillFrequency: 10 * time.Millisecond}); !res.OK() {
		t.Fatalf("grants %v break the promise: %v", grants, res)
	}
}
