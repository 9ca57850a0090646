package scheduler_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/scheduler"
)

// Tests of what the scripts were trimmed to: a queued arrival writes no
// state, enqueue reads the scheduler's liveness from the state, and a
// poll is plain commands on one server.

// TestTicketsUnique: tickets come from the state's done counter plus the
// caller's position, with done moved by grants, steps and cancels. Under
// a random mix of all of them, every ticket is new and larger than every
// earlier one.
func TestTicketsUnique(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	q := newQueue(t, rdb, protocol.Policy{Capacity: 3, RefillAmount: 1, RefillFrequency: 200 * time.Microsecond}, queueio.Options{Lookahead: time.Millisecond})
	takeLock(t, rdb, q, "tok")
	rng := rand.New(rand.NewPCG(1, 2))
	var queued []string
	last := int64(0)
	issued := 0
	for round := range 300 {
		switch op := rng.IntN(10); {
		case op < 6: // a batch of arrivals
			ids := make([]string, 1+rng.IntN(4))
			for i := range ids {
				ids[i] = fmt.Sprintf("c%d-%d", round, i)
			}
			rs, err := q.Enqueue(ctx, ids, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range rs {
				if kindOf(r) > kQueued {
					continue
				}
				if r.Ticket <= last {
					t.Fatalf("round %d: ticket %d after %d (%+v)", round, r.Ticket, last, r)
				}
				last = r.Ticket
				issued++
				if kindOf(r) == kQueued {
					queued = append(queued, r.Entry)
				}
			}
		case op < 8: // a step
			if _, err := scheduler.Step(ctx, rdb, q, "tok"); err != nil {
				t.Fatal(err)
			}
			takeLock(t, rdb, q, "tok") // the step releases the lock when the queue empties
		default: // cancels, of queued and of already scheduled callers
			if len(queued) == 0 {
				continue
			}
			k := 1 + rng.IntN(min(3, len(queued)))
			idx := rng.Perm(len(queued))[:k]
			var leave []queue.Leaver
			for _, i := range idx {
				leave = append(leave, queue.Leaver{Entry: queued[i]})
			}
			if err := q.Cancel(ctx, leave...); err != nil {
				t.Fatal(err)
			}
			for _, l := range leave {
				e := l.Entry
				for i, x := range queued {
					if x == e {
						queued = append(queued[:i], queued[i+1:]...)
						break
					}
				}
			}
		}
	}
	if issued < 300 {
		t.Fatalf("only %d tickets issued: the test exercised too little", issued)
	}
}

// TestSchedulerRunningFromState: enqueue tells a queued caller whether a
// scheduler holds the lock from the state's until, which the step renews
// with the lock and zeroes when it releases it.
func TestSchedulerRunningFromState(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	q := newQueue(t, rdb, protocol.Policy{Capacity: 1, RefillAmount: 1, RefillFrequency: 200 * time.Millisecond},
		queueio.Options{Lookahead: time.Millisecond, LockTTL: 300 * time.Millisecond})
	enqueue := func(id string) queueio.Arrival {
		t.Helper()
		r, err := enqueueOne(q, id)
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := enqueue("a"); kindOf(r) != kGranted {
		t.Fatalf("first caller: %+v, want granted", r)
	}
	if r := enqueue("b"); kindOf(r) != kQueued || r.SchedulerRunning {
		t.Fatalf("second caller, no scheduler yet: %+v, want queued, not running", r)
	}
	takeLock(t, rdb, q, "tok")
	if err := rdb.PExpire(ctx, keysOf(q).Lock, 300*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	st, err := scheduler.Step(ctx, rdb, q, "tok")
	if err != nil || st.Status != scheduler.Running {
		t.Fatalf("step: %+v %v, want running (b is not due yet)", st, err)
	}
	if r := enqueue("c"); !r.SchedulerRunning {
		t.Fatalf("after a step that kept the lock: %+v, want running", r)
	}
	// The lock's TTL passes without another step: the scheduler is gone.
	deadline := time.Now().Add(5 * time.Second)
	for {
		if n, _ := rdb.Exists(ctx, keysOf(q).Lock).Result(); n == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the lock never expired")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if r := enqueue("d"); r.SchedulerRunning {
		t.Fatalf("after the lock expired: %+v, want not running", r)
	}
	// A step that empties the queue releases the lock and says so.
	takeLock(t, rdb, q, "tok2")
	for {
		st, err := scheduler.Step(ctx, rdb, q, "tok2")
		if err != nil {
			t.Fatal(err)
		}
		if st.Status == scheduler.Released {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("queue never drained: %+v", st)
		}
		time.Sleep(st.Next)
	}
	if r := enqueue("e"); kindOf(r) == kQueued && r.SchedulerRunning {
		t.Fatalf("after the step released the lock: %+v, want not running", r)
	}
}

// TestQueuedArrivalWritesNoState: a caller that only queues leaves the
// state key as it was (the cost the trim saves), and the queue, created
// by the first caller with a TTL, keeps one.
func TestQueuedArrivalWritesNoState(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	q := newQueue(t, rdb, protocol.Policy{Capacity: 1, RefillAmount: 1, RefillFrequency: time.Second}, queueio.Options{})
	if r, err := enqueueOne(q, "first"); err != nil || kindOf(r) != kGranted {
		t.Fatalf("first: %+v %v", r, err)
	}
	before, err := rdb.Get(ctx, stateKey(q)).Result()
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		r, err := enqueueOne(q, fmt.Sprint("q", i))
		if err != nil || kindOf(r) != kQueued || r.Position != i+1 {
			t.Fatalf("caller %d: %+v %v, want queued at %d", i, r, err, i+1)
		}
	}
	after, _ := rdb.Get(ctx, stateKey(q)).Result()
	if before != after {
		t.Fatalf("queued arrivals changed the state: %q -> %q", before, after)
	}
	if ttl, _ := rdb.PTTL(ctx, keysOf(q).Queue).Result(); ttl <= 0 {
		t.Fatalf("queue TTL %v, want one", ttl)
	}
}

// scriptOnly hides the *redis.Client behind the Scripter interface, so the
// queue takes the path Cluster and Ring clients take: polls as scripts.
type scriptOnly struct{ queueio.Client }

// stepped queues n callers on a new bucket of policy p through client s
// (rdb serves the test's own reads), runs one step, which must give
// every one its slot, and returns the queue, their entries and their
// slots.
func stepped(t *testing.T, rdb *redis.Client, s queueio.Client, p protocol.Policy, opt queueio.Options, n int) (*queue.Queue, []string, []int64) {
	t.Helper()
	q := newQ(s, "sluice", t.Name(), []protocol.Policy{p}, opt)
	ids := enqueueN(t, rdb, q, n)
	takeLock(t, rdb, q, "tok")
	if r, err := scheduler.Step(ctx, rdb, q, "tok"); err != nil || r.Scheduled != n {
		t.Fatalf("step: %+v %v, want %d scheduled", r, err, n)
	}
	return q, ids, slotsOf(t, rdb, q, ids)
}

// eachPoll runs f, as a subtest each, for each of paths: true with rdb
// (one server: a poll is TIME and GETDEL, the script only when no slot is
// there yet), false with a client through which every poll is the script
// (scriptOnly), as on Cluster.
func eachPoll(t *testing.T, rdb *redis.Client, paths []bool, f func(t *testing.T, s queueio.Client, direct bool)) {
	for _, direct := range paths {
		t.Run(fmt.Sprint("direct=", direct), func(t *testing.T) {
			var s queueio.Client = rdb
			if !direct {
				s = scriptOnly{rdb}
			}
			f(t, s, direct)
		})
	}
}

// TestDirectPollMatchesScript: on one server a poll is TIME and GETDEL;
// through any other client it is the script. Both give the slot the step
// wrote, once, and both say stale past the tolerance.
func TestDirectPollMatchesScript(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	eachPoll(t, rdb, []bool{true, false}, func(t *testing.T, s queueio.Client, direct bool) {
		q, ids, want := stepped(t, rdb, s, protocol.Policy{Capacity: 1, RefillAmount: 1, RefillFrequency: 10 * time.Millisecond},
			queueio.Options{Lookahead: time.Second, LockTTL: time.Second, Grace: 10 * time.Second, MaxLateness: 300 * time.Millisecond}, 3)
		p, err := q.Poll(ctx, ids[0], false)
		if err != nil || pollKindOf(p) != pSlot || p.Slot != want[0] || p.RoundTrips != 1 {
			t.Fatalf("poll: %+v %v, want slot %d in 1 round trip", p, err, want[0])
		}
		if p, err := q.Poll(ctx, ids[0], false); err != nil || pollKindOf(p) != pLost {
			t.Fatalf("second poll: %+v %v, want lost", p, err)
		}
		if p, err := q.Poll(ctx, "never-queued|1", false); err != nil || pollKindOf(p) != pLost {
			t.Fatalf("poll of a stranger: %+v %v, want lost", p, err)
		} else if wantTrips := map[bool]int{true: 2, false: 1}[direct]; p.RoundTrips != wantTrips {
			t.Fatalf("a miss took %d round trips, want %d", p.RoundTrips, wantTrips)
		}
		// The last slot, polled after it is older than the tolerance.
		deadline := time.Now().Add(5 * time.Second)
		for {
			now, err := rdb.Time(ctx).Result()
			if err != nil {
				t.Fatal(err)
			}
			if now.UnixMicro() > want[2]+(320*time.Millisecond).Microseconds() {
				break
			}
			if time.Now().After(deadline) {
				t.Fatal("the Redis clock never passed the slot")
			}
			time.Sleep(5 * time.Millisecond)
		}
		if p, err := q.Poll(ctx, ids[2], false); err != nil || pollKindOf(p) != pStale || p.Delay > -300*time.Millisecond {
			t.Fatalf("late poll: %+v %v, want stale", p, err)
		}
		if n := countSlots(t, rdb, q); n != 1 {
			t.Fatalf("%d slot keys left, want 1 (ids[1]'s)", n)
		}
	})
}

// TestSlotPatternEscapesGlobs: SCAN finds a bucket's slot keys and only
// those, whatever glob characters its name holds.
func TestSlotPatternEscapesGlobs(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	names := []string{"a*", "a?", "a[b]", `a\`, "a"}
	for _, n := range names {
		k := queueio.NewKeys("sluice", n)
		if err := rdb.Set(ctx, k.Slot+strings.SplitN("id|1", "|", 2)[0], 1, time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range names {
		m, err := redistest.Slots(ctx, rdb, queueio.NewKeys("sluice", n).Slot)
		if err != nil {
			t.Fatal(err)
		}
		if len(m) != 1 || m["id"] != 1 {
			t.Errorf("name %q: slots %v, want only its own", n, m)
		}
	}
	if k := queueio.NewKeys("p", "x"); !strings.HasSuffix(k.Slot+strings.SplitN("abc|123", "|", 2)[0], "slot:abc") {
		t.Errorf("SlotKey(entry) = %q, want the bare ID after the prefix", k.Slot+strings.SplitN("abc|123", "|", 2)[0])
	}
}
