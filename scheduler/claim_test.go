package scheduler_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/scheduler"
)

// TestClaimSwapsSlots: three callers given slots 10 ms apart; the first
// does not come for its slot (its process stopped). Once it is 55 ms
// past, the third, polling for its own later slot, is given the first's
// slot instead (Claimed), and the first, when it comes, finds the
// third's slot (Swapped): the two grants keep their instants. Through the
// poll script (through a client that is not one server's, as on Cluster:
// a direct poll, TIME and GETDEL, claims nothing).
func TestClaimSwapsSlots(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	for _, direct := range []bool{false} {
		t.Run(fmt.Sprint("direct=", direct), func(t *testing.T) {
			var s queue.Client = rdb
			if !direct {
				s = scriptOnly{rdb}
			}
			// MaxLateness 100 ms: claims from 50 ms to 80 ms after a slot
			// (older ones only by a move, which a full bucket refuses).
			q := newQ(s, "sluice", t.Name(), []queue.Policy{{Capacity: 1, RefillAmount: 1, RefillFrequency: 10 * time.Millisecond}},
				queue.Options{Lookahead: time.Second, LockTTL: time.Second, Grace: 10 * time.Second, MaxLateness: 100 * time.Millisecond})
			ids := enqueueN(t, rdb, q, 3)
			takeLock(t, rdb, q, "tok")
			if r, err := scheduler.Step(ctx, rdb, q, "tok"); err != nil || r.Scheduled != 3 {
				t.Fatalf("step: %+v %v", r, err)
			}
			want := slotsOf(t, rdb, q, ids)
			// Wait until the first slot is 55 ms past: the others, 15 and 25
			// ms after it, are not yet 50 ms past.
			deadline := time.Now().Add(5 * time.Second)
			for {
				now, err := rdb.Time(ctx).Result()
				if err != nil {
					t.Fatal(err)
				}
				if d := now.UnixMicro() - want[0]; d >= 55000 {
					if d > 70000 {
						t.Skipf("the test process came %v after the first slot, past the claim window: nothing to judge", time.Duration(d)*time.Microsecond)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatal("the Redis clock never passed the slot")
				}
				time.Sleep(time.Millisecond)
			}
			p, err := q.Poll(ctx, ids[2])
			if err != nil || !p.Found || !p.Claimed || p.Slot != want[0] {
				t.Fatalf("the third caller's poll: %+v %v, want the first's slot %d, claimed", p, err, want[0])
			}
			// The second comes for its own (before the first comes: past
			// 50 ms, its slot too would be the first's to claim).
			p, err = q.Poll(ctx, ids[1])
			if err != nil || p.Claimed || p.Swapped || p.Slot != want[1] {
				t.Fatalf("the second caller's poll: %+v %v, want its own slot %d", p, err, want[1])
			}
			p, err = q.Poll(ctx, ids[0])
			if err != nil || !(p.Found || p.Stale) || !p.Swapped || p.Claimed || p.Slot != want[2] {
				t.Fatalf("the first caller's poll: %+v %v, want the third's slot %d, swapped", p, err, want[2])
			}
		})
	}
}
