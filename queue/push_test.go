package queue_test

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/queue"
)

// TestPushMatchesEnqueue: from the same state, callers pushed by the push
// lane get the positions, tickets, estimates and scheduler flag that
// enqueue.lua gives callers who queue. Two buckets get the same state
// string (random levels, anchors in the past, counters), then the same
// arrivals: one through each lane.
func TestPushMatchesEnqueue(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	rng := rand.New(rand.NewPCG(3, 4))
	for round := range 30 {
		p := queue.Policy{Capacity: 1 + rng.Int64N(20), Amount: 1 + rng.Int64N(3), Every: time.Duration(1+rng.Int64N(50)) * time.Second}
		opt := queue.Options{Lookahead: 20 * time.Millisecond, LockTTL: time.Second, Grace: time.Minute, Tolerance: time.Second}
		viaScript := queue.New(rdb, "sluice", fmt.Sprintf("%s-%d-script", t.Name(), round), []queue.Policy{p}, opt)
		viaPush := queue.New(rdb, "sluice", fmt.Sprintf("%s-%d-push", t.Name(), round), []queue.Policy{p}, opt)
		if !viaPush.CanPush() {
			t.Fatal("push lane not available on a *redis.Client with one policy")
		}
		for _, q := range []*queue.Queue{viaScript, viaPush} {
			if err := q.Load(ctx); err != nil {
				t.Fatal(err)
			}
		}
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		// A bucket in debt (no token within the lookahead: both lanes
		// queue), anchored up to one period ago, with a live or dead
		// scheduler, and some callers already waiting.
		level := -rng.Int64N(5 * p.Capacity)
		anchor := now.UnixMicro() - rng.Int64N(p.Every.Microseconds())
		until := now.UnixMicro() + (rng.Int64N(3)-1)*int64(time.Minute/time.Microsecond)
		state := fmt.Sprintf("%d %d %d %d", rng.Int64N(1000), until, level, anchor)
		waiting := rng.IntN(4)
		for _, q := range []*queue.Queue{viaScript, viaPush} {
			if err := rdb.Set(ctx, q.Keys().State, state, time.Minute).Err(); err != nil {
				t.Fatal(err)
			}
			for i := range waiting {
				if err := rdb.RPush(ctx, q.Keys().Queue, "w"+strconv.Itoa(i)+"|1").Err(); err != nil {
					t.Fatal(err)
				}
			}
		}
		ids := []string{"a", "b", "c"}[:1+rng.IntN(3)]
		want, err := viaScript.EnqueueBatch(ctx, ids)
		if err != nil {
			t.Fatal(err)
		}
		got, err := viaPush.PushBatch(ctx, ids)
		if err != nil {
			t.Fatal(err)
		}
		for i := range ids {
			w, g := want[i], got[i]
			if w.Kind != queue.Queued {
				t.Fatalf("round %d: the script did not queue %s (%+v): the state left a token free", round, ids[i], w)
			}
			west, _ := strconv.ParseInt(w.Entry[strings.IndexByte(w.Entry, '|')+1:], 10, 64)
			if g.Kind != w.Kind || g.Position != w.Position || g.Ticket != w.Ticket || g.SchedulerRunning != w.SchedulerRunning {
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
	q := newQueue(t, rdb, queue.Policy{Capacity: 1, Amount: 1, Every: time.Hour}, queue.Options{Grace: 5 * time.Second})
	if _, err := q.PushBatch(ctx, []string{"first"}); err != nil {
		t.Fatal(err)
	}
	if ttl, _ := rdb.PTTL(ctx, q.Keys().Queue).Result(); ttl <= 0 || ttl > 5*time.Second {
		t.Fatalf("new queue's TTL %v, want (0, 5s]", ttl)
	}
	if err := rdb.PExpire(ctx, q.Keys().Queue, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := q.PushBatch(ctx, []string{"second", "third"}); err != nil {
		t.Fatal(err)
	}
	if ttl, _ := rdb.PTTL(ctx, q.Keys().Queue).Result(); ttl < 59*time.Minute {
		t.Fatalf("existing queue's TTL became %v, want its hour kept", ttl)
	}
	if n, _ := rdb.LLen(ctx, q.Keys().Queue).Result(); n != 3 {
		t.Fatalf("queue length %d, want 3", n)
	}
}

// TestStepPublishesPushedCallers: an entry pushed without an estimate is
// published as soon as the step gives it a slot, whatever the slot.
func TestStepPublishesPushedCallers(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	q := newQueue(t, rdb, queue.Policy{Capacity: 5, Amount: 1, Every: time.Millisecond}, queue.Options{Lookahead: time.Second})
	sub := rdb.Subscribe(ctx, q.Keys().Wake)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	rs, err := q.PushBatch(ctx, []string{"x", "y"})
	if err != nil {
		t.Fatal(err)
	}
	takeLock(t, rdb, q, "tok")
	if r, err := q.Step(ctx, "tok"); err != nil || r.Scheduled != 2 {
		t.Fatalf("step: %+v %v", r, err)
	}
	msg, err := sub.ReceiveMessage(withDeadline(t, 5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(msg.Payload)
	if len(f) != 4 || f[0] != rs[0].Entry || f[2] != rs[1].Entry {
		t.Fatalf("published %q, want both pushed entries with their slots", msg.Payload)
	}
}

// TestNoPushThroughScripter: only a *redis.Client, with one policy and no
// refusals configured, may push.
func TestNoPushThroughScripter(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	p := queue.Policy{Capacity: 1, Amount: 1, Every: time.Second}
	for name, q := range map[string]*queue.Queue{
		"scripter":  queue.New(scriptOnly{rdb}, "sluice", "a", []queue.Policy{p}, queue.Options{}),
		"two":       queue.New(rdb, "sluice", "b", []queue.Policy{p, p}, queue.Options{}),
		"max queue": queue.New(rdb, "sluice", "c", []queue.Policy{p}, queue.Options{MaxQueue: 5}),
		"max wait":  queue.New(rdb, "sluice", "d", []queue.Policy{p}, queue.Options{MaxWait: time.Second}),
	} {
		if q.CanPush() {
			t.Errorf("%s: CanPush", name)
		}
		if _, err := q.PushBatch(ctx, []string{"x"}); err == nil {
			t.Errorf("%s: PushBatch succeeded", name)
		}
	}
	var _ redis.Scripter = scriptOnly{rdb}
}
