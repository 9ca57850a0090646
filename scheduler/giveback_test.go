package scheduler_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testing/guarantee"
	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/scheduler"
)

// TestGiveBacksKeepThePromise: a random mix of arrivals, steps and
// callers who come for their slots on time, late (they retime, giving
// their tokens back when that is exact), or not at all (they leave,
// passing their slots to the next caller in line), on a bucket saturated
// most of the time: every
// grant in the end, judged by the checker, keeps the promise. Each seed
// runs a few hundred rounds against the Redis clock.
func TestGiveBacksKeepThePromise(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3, 4, 5, 6} {
		t.Run(fmt.Sprint("seed", seed), func(t *testing.T) {
			t.Parallel()
			giveBackRounds(t, seed)
		})
	}
}

func giveBackRounds(t *testing.T, seed uint64) {
	srv := redistest.New(t)
	rdb := srv.Client()
	defer rdb.Close()
	rng := rand.New(rand.NewPCG(seed, 7))
	p := queue.Policy{Capacity: int64(1 + rng.IntN(16)), RefillAmount: 1, RefillFrequency: time.Duration(1+rng.IntN(4)) * time.Millisecond}
	l := guarantee.Limit{Capacity: int(p.Capacity), RefillAmount: 1, RefillFrequency: p.RefillFrequency}
	q := newQueue(t, rdb, p, queue.Options{Lookahead: time.Duration(2+rng.IntN(15)) * time.Millisecond, MaxLateness: time.Millisecond})
	takeLock(t, rdb, q, "tok")
	type holder struct {
		entry, room string
		slot        int64
		since       time.Time
		lateBy      time.Duration
		leaves      bool
	}
	var (
		queued []string
		found  []holder
		grants []time.Time
		backs  int
	)
	for round := range 2500 {
		switch op := rng.IntN(10); {
		case op < 4: // arrivals
			ids := make([]string, 1+rng.IntN(3))
			for i := range ids {
				ids[i] = fmt.Sprintf("c%d-%d", round, i)
			}
			rs, err := q.Enqueue(ctx, ids, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rs {
				if r.Entry != "" {
					queued = append(queued, r.Entry)
				} else if r.Err == nil {
					grants = append(grants, time.UnixMicro(r.Slot)) // at once: it comes
				}
			}
		case op < 6: // a step
			if _, err := scheduler.Step(ctx, rdb, q, "tok"); err != nil {
				t.Fatal(err)
			}
			takeLock(t, rdb, q, "tok")
		default: // the queued callers poll, in order
			for len(queued) > 0 {
				r, err := q.Poll(ctx, queued[0])
				if err != nil {
					t.Fatal(err)
				}
				if !r.Found && !r.Stale {
					break
				}
				h := holder{entry: queued[0], room: r.Room, slot: r.Slot, since: time.Now()}
				switch k := rng.IntN(10); {
				case k < 5:
					grants = append(grants, time.UnixMicro(r.Slot)) // on time
				case k < 8:
					h.lateBy = time.Duration(rng.IntN(80)) * time.Millisecond
					found = append(found, h)
				default:
					h.leaves = true
					h.lateBy = time.Duration(rng.IntN(10)) * time.Millisecond
					found = append(found, h)
				}
				queued = queued[1:]
			}
		}
		// The late ones come now (retime) or leave (cancel), when due.
		kept := found[:0]
		for _, h := range found {
			if time.Since(h.since) < h.lateBy {
				kept = append(kept, h)
				continue
			}
			if h.leaves {
				if err := q.Cancel(ctx, queue.Leaver{Entry: h.entry, Room: h.room, Slot: h.slot}); err != nil {
					t.Fatal(err)
				}
				continue
			}
			r, err := q.Retime(ctx, h.room, nil)
			if err != nil {
				t.Fatal(err)
			}
			if r.Refunded {
				backs++
			}
			grants = append(grants, time.UnixMicro(r.Slot)) // it comes for the new slot
		}
		found = kept
		time.Sleep(time.Duration(rng.IntN(1000)) * time.Microsecond)
	}
	if res := guarantee.Check(grants, l); !res.OK() {
		t.Fatalf("%d grants on %+v (%d tokens given back by late callers) break the promise: %v", len(grants), l, backs, res)
	}
	t.Logf("%d grants on %+v, %d late callers gave their tokens back", len(grants), l, backs)
}
