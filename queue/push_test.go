package queue

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// TestPushMatchesEnqueue: from the same state, callers pushed by the push
// lane get the positions, tickets, estimates and scheduler flag that
// enqueue.lua gives callers who arrive behind waiting ones. Two buckets get
// the same state string (random levels, anchors in the past, counters), then the same
// arrivals: one through each lane.
func TestPushMatchesEnqueue(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 30 {
		p := protocol.Policy{Capacity: 1 + rng.Int64N(20), RefillAmount: 1 + rng.Int64N(3), RefillFrequency: time.Duration(1+rng.Int64N(50)) * time.Second}
		opt := queueio.Options{Lookahead: 20 * time.Millisecond, LockTTL: time.Second, Grace: time.Minute, MaxLateness: time.Second}
		viaScript := newQ(rdb, "sluice", fmt.Sprintf("%s-%d-script", t.Name(), round), []protocol.Policy{p}, opt)
		viaPush := newQ(rdb, "sluice", fmt.Sprintf("%s-%d-push", t.Name(), round), []protocol.Policy{p}, opt)
		if !viaPush.canPush() {
			t.Fatal("push lane not available on a *redis.Client with one policy")
		}
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		// A bucket in debt (no token within the lookahead: both lanes
		// queue), anchored up to one period ago, with a live or dead
		// scheduler, and some callers already waiting.
		level := -rng.Int64N(5 * p.Capacity)
		anchor := now.UnixMicro() - rng.Int64N(p.RefillFrequency.Microseconds())
		until := now.UnixMicro() + (rng.Int64N(3)-1)*int64(time.Minute/time.Microsecond)
		state := fmt.Sprintf("%d %d %d %d %d %s 0 0", rng.Int64N(1000), until, level, anchor, protocol.StateFormat, protocol.ConfigID([]protocol.Policy{p}))
		waiting := rng.IntN(4)
		for _, q := range []*Queue{viaScript, viaPush} {
			if err := rdb.Set(ctx, q.keys.State, state, time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			for i := range waiting {
				if err := rdb.RPush(ctx, q.keys.Queue, "w"+strconv.Itoa(i)+"|1").Err(); err != nil {
					t.Fatal(err)
				}
			}
		}
		ids := []string{"a", "b", "c"}[:1+rng.IntN(3)]
		want, err := viaScript.enqueueScript(ctx, ids, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		got, err := viaPush.push(ctx, ids)
		if err != nil {
			t.Fatal(err)
		}
		for i := range ids {
			w, g := want[i], got[i]
			if kindOf(w) != kQueued {
				t.Fatalf("round %d: the script did not queue %s (%+v): the state left a token free", round, ids[i], w)
			}
			west, _ := strconv.ParseInt(w.Entry[strings.IndexByte(w.Entry, '|')+1:], 10, 64)
			if kindOf(g) != kindOf(w) || g.Position != w.Position || g.Ticket != w.Ticket || g.SchedulerRunning != w.SchedulerRunning {
				t.Fatalf("round %d, caller %s: push %+v, script %+v", round, ids[i], g, w)
			}
			// Both estimates are the same instant (slots come on whole
			// refill periods, a second or more apart, whatever the now);
			// the delays differ by the time between the two calls.
			if d := w.Delay - g.Delay; d > 500*time.Millisecond || d < -500*time.Millisecond {
				t.Fatalf("round %d, caller %s: delays %v (script, estimate %d) and %v (push) differ by more than the calls' distance", round, ids[i], w.Delay, west, g.Delay)
			}
			if g.Entry != ids[i]+"|0" {
				t.Fatalf("push entry %q, want %q", g.Entry, ids[i]+"|0")
			}
		}
	}
}

// TestPushQueueTTL: a queue the push lane creates gets a TTL; one that
// exists keeps its own (the steps renew it to tail + grace, which may
// exceed grace).
func TestPushQueueTTL(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	q := newQueue(t, rdb, protocol.Policy{Capacity: 1, RefillAmount: 1, RefillFrequency: time.Hour}, queueio.Options{Grace: 5 * time.Second})
	if _, err := q.push(ctx, []string{"first"}); err != nil {
		t.Fatal(err)
	}
	if ttl, _ := rdb.PTTL(ctx, q.keys.Queue).Result(); ttl <= 0 || ttl > 5*time.Second {
		t.Fatalf("new queue's TTL %v, want (0, 5s]", ttl)
	}
	if err := rdb.PExpire(ctx, q.keys.Queue, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := q.push(ctx, []string{"second", "third"}); err != nil {
		t.Fatal(err)
	}
	if ttl, _ := rdb.PTTL(ctx, q.keys.Queue).Result(); ttl < 59*time.Minute {
		t.Fatalf("existing queue's TTL became %v, want its hour kept", ttl)
	}
	if n, _ := rdb.LLen(ctx, q.keys.Queue).Result(); n != 3 {
		t.Fatalf("queue length %d, want 3", n)
	}
}

// TestNoPushThroughScripter: only a *redis.Client, with one policy and no
// refusals configured, may push.
func TestNoPushThroughScripter(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	p := protocol.Policy{Capacity: 1, RefillAmount: 1, RefillFrequency: time.Second}
	for name, q := range map[string]*Queue{
		"scripter":  newQ(scriptOnly{rdb}, "sluice", "a", []protocol.Policy{p}, queueio.Options{}),
		"two":       newQ(rdb, "sluice", "b", []protocol.Policy{p, p}, queueio.Options{}),
		"max queue": newQ(rdb, "sluice", "c", []protocol.Policy{p}, queueio.Options{MaxQueue: 5}),
		"max wait":  newQ(rdb, "sluice", "d", []protocol.Policy{p}, queueio.Options{MaxWait: time.Second}),
	} {
		if q.canPush() {
			t.Errorf("%s: canPush", name)
		}
		if _, err := q.push(ctx, []string{"x"}); err == nil {
			t.Errorf("%s: push succeeded", name)
		}
	}
	var _ redis.Scripter = scriptOnly{rdb}
}

// TestPushSaysClaim: an arrival through the push lane is told to poll at
// once (Arrival.Claim) when the due set's first slot is another handle's
// and was not collected half of MaxLateness after its instant; not when
// the set is empty, the slot is younger, or it is the arrival's own
// handle's (claim.lua takes only from other handles).
func TestPushSaysClaim(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	p := protocol.Policy{Capacity: 1, RefillAmount: 1, RefillFrequency: time.Second}
	opt := queueio.Options{Lookahead: 20 * time.Millisecond, LockTTL: time.Second, Grace: time.Minute, MaxLateness: 100 * time.Millisecond}
	for _, c := range []struct {
		name   string
		member string
		ago    time.Duration // how long before now the due slot was (wide: a slow test process changes nothing)
		want   bool
	}{
		{"empty", "", 0, false},
		{"another handle's, 500 ms past", "other.1|0", 500 * time.Millisecond, true},
		{"another handle's, 10 s ahead", "other.1|0", -10 * time.Second, false},
		{"its own handle's, 500 ms past", "mine.1|0", 500 * time.Millisecond, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			q := newQ(rdb, "sluice", t.Name(), []protocol.Policy{p}, opt)
			// Someone waits, so that the arrival takes the push lane.
			if err := rdb.RPush(ctx, q.keys.Queue, "w.0|1").Err(); err != nil {
				t.Fatal(err)
			}
			if c.member != "" {
				now, err := rdb.Time(ctx).Result()
				if err != nil {
					t.Fatal(err)
				}
				if err := rdb.ZAdd(ctx, q.keys.Due, redis.Z{Score: float64(now.Add(-c.ago).UnixMicro()), Member: c.member}).Err(); err != nil {
					t.Fatal(err)
				}
			}
			rs, err := q.push(ctx, []string{"mine.2"})
			if err != nil {
				t.Fatal(err)
			}
			if rs[0].Claim != c.want {
				t.Fatalf("Claim = %v, want %v", rs[0].Claim, c.want)
			}
		})
	}
}
