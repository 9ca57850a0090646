package scheduler_test

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
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
// runs a few hundred rounds against the Redis clock. Seeds from 7 on
// have two policies, calls and tokens, and callers that cost 1 call and
// a random number of tokens each; seed 10 a capacity of 1. Seeds from 11
// on give their callers a MaxLateness of 10 ms, and one policy: a late
// caller, or one still queued, may claim a slot whose caller has not
// polled for it yet (or move an older one to now), and that caller finds
// its slot taken (stale, no room) and retimes, as one whose poll comes
// stale does (internal/protocol/claim.lua; TestClaimSwapsSlots and
// TestQueuedCallerTakesSlot make one for certain). Counting a taken slot
// as its first caller's grant too broke the promise by one in 3 of 6
// runs of seed 13: the test's mistake, not the bucket's, which retimes
// such a caller. (Seed 8's tokens, refilling 8 every
// 1 ms on a capacity of 74, broke the promise in 2-3 of 10 runs before
// the peaks counted the refill lag: tokens.lua's lag_peak. Seed 10 broke
// it by one in 2 of 8 runs beside a busy loop: a caller "late" by 0 ms
// retimed before its slot, and its grant moved to now, earlier: now it
// keeps its slot, retime.lua, TestRetimeBeforeItsSlot.)
func TestGiveBacksKeepThePromise(t *testing.T) {
	for _, seed := range []uint64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13} {
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
	p := protocol.Policy{Capacity: int64(1 + rng.IntN(16)), RefillAmount: 1, RefillFrequency: time.Duration(1+rng.IntN(4)) * time.Millisecond}
	if seed == 10 {
		p.Capacity = 1 // a late caller back within a period moves with no refill in between
	}
	ps := []protocol.Policy{p}
	if seed >= 7 && seed <= 10 {
		ps = append(ps, protocol.Policy{Unit: "tokens", Capacity: int64(20 + rng.IntN(80)), RefillAmount: int64(1 + rng.IntN(10)), RefillFrequency: time.Millisecond})
	}
	maxLate := time.Millisecond // no claims (protocol.ClaimWindow)
	if seed >= 11 {
		maxLate = 10 * time.Millisecond
	}
	q := newQ(rdb, "sluice", t.Name(), ps, queueio.Options{Lookahead: time.Duration(2+rng.IntN(15)) * time.Millisecond, MaxLateness: maxLate,
		LockTTL: time.Second, Grace: 10 * time.Second})
	takeLock(t, rdb, q, "tok")
	// costs is a new caller's: nil (one call) with one policy, else one
	// call and up to half the tokens' capacity.
	costs := func() []int64 {
		if len(ps) == 1 {
			return nil
		}
		return []int64{1, 1 + rng.Int64N(ps[1].Capacity/2)}
	}
	type holder struct {
		entry, room string
		slot        int64
		since       time.Time
		lateBy      time.Duration
		leaves      bool
		costs       []int64
	}
	var (
		queued []string
		cost   = map[string][]int64{} // a queued entry's costs
		found  []holder
		grants []time.Time
		tokens []guarantee.Grant // the second policy's
		backs  int
		claims int
	)
	grant := func(slot int64, cs []int64) {
		grants = append(grants, time.UnixMicro(slot))
		if cs != nil {
			tokens = append(tokens, guarantee.Grant{At: time.UnixMicro(slot), Cost: int(cs[1])})
		}
	}
	for round := range 2500 {
		switch op := rng.IntN(10); {
		case op < 4: // arrivals
			ids := make([]string, 1+rng.IntN(3))
			for i := range ids {
				ids[i] = fmt.Sprintf("c%d-%d", round, i)
			}
			var cs [][]int64
			if len(ps) > 1 {
				for range ids {
					cs = append(cs, costs())
				}
			}
			rs, err := q.Enqueue(ctx, ids, cs, nil)
			if err != nil {
				t.Fatal(err)
			}
			for i, r := range rs {
				var c []int64
				if cs != nil {
					c = cs[i]
				}
				if r.Entry != "" {
					queued = append(queued, r.Entry)
					cost[r.Entry] = c
				} else if r.Err == nil {
					grant(r.Slot, c) // at once: it comes
				}
			}
		case op < 6: // a step
			if _, err := scheduler.Step(ctx, rdb, q, "tok"); err != nil {
				t.Fatal(err)
			}
			takeLock(t, rdb, q, "tok")
		default: // the queued callers poll, in order
			for len(queued) > 0 {
				r, err := q.Poll(ctx, queued[0], false)
				if err != nil {
					t.Fatal(err)
				}
				if !r.Found && !r.Stale {
					break
				}
				if r.Claimed {
					claims++
				}
				h := holder{entry: queued[0], room: r.Room, slot: r.Slot, since: time.Now(), costs: cost[queued[0]]}
				delete(cost, queued[0])
				switch k := rng.IntN(10); {
				case r.Stale:
					// Its slot passed, or a running caller took it
					// (no room): it retimes at once, as the bucket does.
					found = append(found, h)
				case k < 5:
					grant(r.Slot, h.costs) // on time
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
				if err := q.Cancel(ctx, queue.Leaver{Entry: h.entry, Room: h.room, Slot: h.slot, Costs: h.costs}); err != nil {
					t.Fatal(err)
				}
				continue
			}
			r, err := q.Retime(ctx, h.slot, h.room, h.costs, "", true)
			if err != nil {
				t.Fatal(err)
			}
			if r.Refunded {
				backs++
			}
			if r.Claimed {
				claims++
			}
			grant(r.Slot, h.costs) // it comes for the new slot
		}
		found = kept
		time.Sleep(time.Duration(rng.IntN(1000)) * time.Microsecond)
	}
	l := guarantee.Limit{Capacity: int(p.Capacity), RefillAmount: 1, RefillFrequency: p.RefillFrequency}
	if res := guarantee.Check(grants, l); !res.OK() {
		t.Fatalf("%d grants on %+v (%d tokens given back by late callers) break the promise: %v", len(grants), l, backs, res)
	}
	if len(ps) > 1 {
		lt := guarantee.Limit{Capacity: int(ps[1].Capacity), RefillAmount: int(ps[1].RefillAmount), RefillFrequency: ps[1].RefillFrequency}
		if res := guarantee.CheckCosts(tokens, lt, 0); !res.OK() {
			t.Fatalf("%d grants' tokens on %+v (%d late callers' tokens given back) break the promise: %v", len(tokens), lt, backs, res)
		}
	}
	t.Logf("%d grants on %+v, %d late callers gave their tokens back, %d slots claimed", len(grants), ps, backs, claims)
}
