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
	given := map[string]bool{}
	var order []string
	var bSlots []time.Time // collected by b's polls
	deadline := time.Now().Add(5 * time.Second)
	// stepUntil steps until n callers have their slots, noting the order
	// they were given in; b's process runs: its callers collect theirs.
	stepUntil := func(n int) {
		t.Helper()
		for len(order) < n {
			if time.Now().After(deadline) {
				t.Fatalf("given %v in 5 s, want %d", order, n)
			}
			if _, err := scheduler.Step(ctx, rdb, q, "tok"); err != nil {
				t.Fatal(err)
			}
			for i, id := range ids {
				if n, _ := rdb.Exists(ctx, slotKey(q, id)).Result(); n == 0 || given[id] {
					continue
				}
				given[id], order = true, append(order, id)
				if id[0] == 'b' {
					p, err := q.Poll(ctx, entries[i], false)
					if err != nil || !p.Found {
						t.Fatalf("%s's poll: %+v %v, want its slot", id, p, err)
					}
					bSlots = append(bSlots, time.UnixMicro(p.Slot))
				}
			}
			time.Sleep(time.Millisecond)
		}
	}
	stepUntil(1)
	if order[0] != "a.0" {
		t.Fatalf("the first slot went to %s, want a.0", order[0])
	}
	// a.0 does not come for its slot: wait until it is PassOver past.
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
	stepUntil(3)
	if order[1] != "b.0" || order[2] != "b.1" {
		t.Fatalf("slots given to %v, want b.0 and b.1 after a.0 (a passed over)", order)
	}
	if head, err := rdb.LIndex(ctx, keysOf(q).Queue, 0).Result(); err != nil || head != entries[1] {
		t.Fatalf("queue head %q %v, want a.1's entry %q: its place kept", head, err, entries[1])
	}
	// Nobody else queued: a's callers are served, in order.
	stepUntil(len(ids))
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
