package scheduler_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/internal/rediskey"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/scheduler"
)

var ctx = context.Background()

func newQueue(t *testing.T, rdb *redis.Client, p protocol.Policy, opt queueio.Options) *queue.Queue {
	t.Helper()
	if opt.LockTTL == 0 {
		opt.LockTTL = time.Second
	}
	if opt.Grace == 0 {
		opt.Grace = 10 * time.Second
	}
	if opt.Lookahead == 0 {
		opt.Lookahead = 20 * time.Millisecond
	}
	if opt.MaxLateness == 0 {
		opt.MaxLateness = time.Second
	}
	q := newQ(rdb, "sluice", t.Name(), []protocol.Policy{p}, opt)
	return q
}

// takeLock plays the part of redislock: the scheduler lock holds a token.
func takeLock(t *testing.T, rdb *redis.Client, q *queue.Queue, token string) {
	t.Helper()
	if err := rdb.Set(ctx, keysOf(q).Lock, token, time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
}

// slotsOf returns the slot of each ID, in arrival order, from its slot key.
func slotsOf(t *testing.T, rdb *redis.Client, q *queue.Queue, ids []string) []int64 {
	t.Helper()
	out := make([]int64, len(ids))
	for i, id := range ids {
		raw, err := rdb.Get(ctx, slotKey(q, id)).Result()
		s, _, ok := protocol.ParseSlotValue(raw)
		if err == nil && !ok {
			err = fmt.Errorf("slot key holds %q", raw)
		}
		if err != nil {
			t.Fatalf("slot of %s (#%d): %v", id, i, err)
		}
		out[i] = s
	}
	return out
}

// countSlots is how many slot keys the bucket has.
func countSlots(t *testing.T, rdb *redis.Client, q *queue.Queue) int {
	t.Helper()
	m, err := redistest.Slots(ctx, rdb, keysOf(q).Slot)
	if err != nil {
		t.Fatal(err)
	}
	return len(m)
}

// queueSlotKeys lists the bucket's slot keys.
func queueSlotKeys(t *testing.T, rdb *redis.Client, q *queue.Queue) []string {
	t.Helper()
	m, err := redistest.Slots(ctx, rdb, keysOf(q).Slot)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for id := range m {
		out = append(out, keysOf(q).Slot+id)
	}
	return out
}

// enqueueN makes n callers arrive and queue: a placeholder at the head of
// the list keeps the fast path closed while they arrive, and leaves after.
// It returns their entries, in arrival order.
func enqueueN(t *testing.T, rdb *redis.Client, q *queue.Queue, n int) []string {
	t.Helper()
	if err := rdb.RPush(ctx, keysOf(q).Queue, "placeholder").Err(); err != nil {
		t.Fatal(err)
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("caller-%03d", i)
		r, err := enqueueOne(q, ids[i])
		if err != nil {
			t.Fatal(err)
		}
		if kindOf(r) != kQueued || r.Position != i+2 {
			t.Fatalf("caller %d: %+v, want queued at %d", i, r, i+2)
		}
		ids[i] = r.Entry
	}
	if err := rdb.LRem(ctx, keysOf(q).Queue, 1, "placeholder").Err(); err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestFIFOSlotsInArrivalOrder is defect 1 (LIFO): the scheduler must give
// slots in the order callers arrived at Redis.
func TestFIFOSlotsInArrivalOrder(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	q := newQueue(t, rdb, protocol.Policy{Capacity: 3, RefillAmount: 1, RefillFrequency: 100 * time.Microsecond}, queueio.Options{Lookahead: time.Second})
	ids := enqueueN(t, rdb, q, 50)
	takeLock(t, rdb, q, "tok")
	r, err := scheduler.Step(ctx, rdb, q, "tok")
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != scheduler.Released || r.Scheduled != 50 {
		t.Fatalf("step: %+v, want all 50 scheduled and the lock released", r)
	}
	slots := slotsOf(t, rdb, q, ids)
	for i := 1; i < len(slots); i++ {
		if slots[i] < slots[i-1] {
			t.Fatalf("caller %d got slot %d, before caller %d's %d: not FIFO", i, slots[i], i-1, slots[i-1])
		}
	}
	if slots[3] <= slots[2] || slots[49] <= slots[3] {
		t.Fatalf("capacity 3, one token per refill, but slots %v", slots[:5])
	}
	if n, _ := rdb.Exists(ctx, keysOf(q).Lock).Result(); n != 0 {
		t.Fatal("lock still held after the queue emptied")
	}
}

// TestTwoSchedulersAtOnce is defect 2 (double scheduling): two schedulers
// that both believe they hold the lock step concurrently. Every caller
// must get exactly one slot, slots stay FIFO and within the guarantee.
func TestTwoSchedulersAtOnce(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	p := protocol.Policy{Capacity: 2, RefillAmount: 1, RefillFrequency: 50 * time.Microsecond}
	q := newQueue(t, rdb, p, queueio.Options{Lookahead: time.Second, MaxBatch: 3})
	ids := enqueueN(t, rdb, q, 300)
	takeLock(t, rdb, q, "shared")
	var wg sync.WaitGroup
	var mu sync.Mutex
	scheduled := map[int]int{}
	for s := 0; s < 2; s++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				r, err := scheduler.Step(ctx, rdb, q, "shared")
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				scheduled[s] += r.Scheduled
				mu.Unlock()
				if r.Status != scheduler.Running {
					return
				}
			}
		}()
	}
	wg.Wait()
	if scheduled[0] == 0 || scheduled[1] == 0 {
		t.Fatalf("one scheduler did all the work (%v): the test did not overlap them", scheduled)
	}
	if n := countSlots(t, rdb, q); n != len(ids) {
		t.Fatalf("%d slots for %d callers", n, len(ids))
	}
	slots := slotsOf(t, rdb, q, ids)
	if !slices.IsSorted(slots) {
		t.Fatal("slots not in arrival order")
	}
	times := make([]time.Time, len(slots))
	for i, s := range slots {
		times[i] = time.UnixMicro(s)
	}
	if res := guarantee.Check(times, guarantee.Limit{Capacity: 2, RefillAmount: 1, RefillFrequency: p.RefillFrequency}); !res.OK() {
		t.Fatalf("two schedulers broke the guarantee: %v", res)
	}
}

// TestStaleSchedulerIsFenced: a scheduler whose lock has passed to another
// token changes nothing.
func TestStaleSchedulerIsFenced(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	q := newQueue(t, rdb, protocol.Policy{Capacity: 1, RefillAmount: 1, RefillFrequency: time.Millisecond}, queueio.Options{Lookahead: time.Second})
	enqueueN(t, rdb, q, 10)
	takeLock(t, rdb, q, "new-holder")
	before, _ := rdb.Get(ctx, stateKey(q)).Result()
	r, err := scheduler.Step(ctx, rdb, q, "old-holder")
	if err != nil {
		t.Fatal(err)
	}
	if r.Status != scheduler.Fenced {
		t.Fatalf("step with a stale token: %+v, want fenced", r)
	}
	after, _ := rdb.Get(ctx, stateKey(q)).Result()
	if n, _ := rdb.LLen(ctx, keysOf(q).Queue).Result(); n != 10 {
		t.Fatalf("queue has %d, want 10 untouched", n)
	}
	if n := countSlots(t, rdb, q); n != 0 {
		t.Fatalf("fenced step wrote %d slots", n)
	}
	if fmt.Sprint(before) != fmt.Sprint(after) {
		t.Fatalf("fenced step changed the state: %v -> %v", before, after)
	}
	if v, _ := rdb.Get(ctx, keysOf(q).Lock).Result(); v != "new-holder" {
		t.Fatalf("fenced step touched the lock: %q", v)
	}
}

// TestSlotConsumedOnce is defect 6 (full bypass): a slot is handed out by
// exactly one poll.
func TestSlotConsumedOnce(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	q := newQueue(t, rdb, protocol.Policy{Capacity: 1, RefillAmount: 1, RefillFrequency: time.Millisecond}, queueio.Options{Lookahead: time.Second})
	ids := enqueueN(t, rdb, q, 1)
	takeLock(t, rdb, q, "tok")
	if _, err := scheduler.Step(ctx, rdb, q, "tok"); err != nil {
		t.Fatal(err)
	}
	first, err := q.Poll(ctx, ids[0], false)
	if err != nil || pollKindOf(first) != pSlot {
		t.Fatalf("first poll: %+v %v, want the slot", first, err)
	}
	second, err := q.Poll(ctx, ids[0], false)
	if err != nil || pollKindOf(second) != pLost {
		t.Fatalf("second poll: %+v %v, want lost (slot already used)", second, err)
	}
}

// TestStaleSlotRefused: a caller polling long after its slot gets no
// permission to start (its late start would bunch with later ones).
func TestStaleSlotRefused(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	q := newQueue(t, rdb, protocol.Policy{Capacity: 1, RefillAmount: 1, RefillFrequency: time.Millisecond}, queueio.Options{Lookahead: 5 * time.Millisecond, MaxLateness: time.Millisecond})
	ids := enqueueN(t, rdb, q, 1)
	takeLock(t, rdb, q, "tok")
	if r, err := scheduler.Step(ctx, rdb, q, "tok"); err != nil || r.Scheduled != 1 {
		t.Fatalf("step: %+v %v", r, err)
	}
	// Wait, on the Redis clock, until the slot is more than the tolerance old.
	raw, err := rdb.Get(ctx, slotKey(q, ids[0])).Result()
	slot, _, ok := protocol.ParseSlotValue(raw)
	if err != nil || !ok {
		t.Fatalf("slot key holds %q (%v)", raw, err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		now, err := rdb.Time(ctx).Result()
		if err != nil {
			t.Fatal(err)
		}
		if now.UnixMicro() > int64(slot)+2000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("Redis clock did not pass the slot")
		}
		time.Sleep(time.Millisecond)
	}
	r, err := q.Poll(ctx, ids[0], false)
	if err != nil || pollKindOf(r) != pStale {
		t.Fatalf("late poll: %+v %v, want stale", r, err)
	}
}

// TestEnqueueRefusalsConsumeNothing: MaxQueue and MaxWait refuse without
// touching the queue or the bucket.
func TestEnqueueRefusalsConsumeNothing(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	// Slots 1 s apart: a stall of the test machine cannot change the estimates much.
	q := newQueue(t, rdb, protocol.Policy{Capacity: 1, RefillAmount: 1, RefillFrequency: time.Second}, queueio.Options{MaxQueue: 3, MaxWait: 2500 * time.Millisecond, Lookahead: time.Millisecond})
	if r, _ := enqueueOne(q, "a"); kindOf(r) != kGranted {
		t.Fatalf("first caller: %+v, want granted", r)
	}
	for _, id := range []string{"b", "c"} { // slots ~1 and ~2 s away
		if r, _ := enqueueOne(q, id); kindOf(r) != kQueued {
			t.Fatalf("%s: %+v, want queued", id, r)
		}
	}
	state, _ := rdb.Get(ctx, stateKey(q)).Result()
	r, err := enqueueOne(q, "d") // would wait ~3 s > MaxWait
	if err != nil || kindOf(r) != kWaitTooLong || r.Delay <= 2500*time.Millisecond {
		t.Fatalf("d: %+v %v, want wait too long with its estimate", r, err)
	}
	q2 := newQ(rdb, "sluice", t.Name(), []protocol.Policy{{Capacity: 1, RefillAmount: 1, RefillFrequency: time.Second}}, queueio.Options{MaxQueue: 2, Lookahead: time.Millisecond, Grace: time.Second})
	if r, _ := enqueueOne(q2, "e"); kindOf(r) != kQueueFull {
		t.Fatalf("e: %+v, want queue full", r)
	}
	if n, _ := rdb.LLen(ctx, keysOf(q).Queue).Result(); n != 2 {
		t.Fatalf("queue length %d after refusals, want 2", n)
	}
	after, _ := rdb.Get(ctx, stateKey(q)).Result()
	if fmt.Sprint(state) != fmt.Sprint(after) {
		t.Fatalf("a refusal changed the state: %v -> %v", state, after)
	}
}

// TestEveryKeyExpires is defect 7 (leaks): every key of a bucket carries a
// TTL, and an idle bucket leaves nothing behind.
func TestEveryKeyExpires(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	p := protocol.Policy{Capacity: 2, RefillAmount: 1, RefillFrequency: time.Millisecond}
	q := newQueue(t, rdb, p, queueio.Options{Grace: 50 * time.Millisecond, Lookahead: 100 * time.Millisecond, LockTTL: 200 * time.Millisecond})
	enqueueN(t, rdb, q, 20)
	takeLock(t, rdb, q, "tok")
	if err := rdb.PExpire(ctx, keysOf(q).Lock, 200*time.Millisecond).Err(); err != nil {
		t.Fatal(err)
	}
	if _, err := scheduler.Step(ctx, rdb, q, "tok"); err != nil {
		t.Fatal(err)
	}
	slots := queueSlotKeys(t, rdb, q)
	if len(slots) == 0 {
		t.Fatal("the step wrote no slot keys")
	}
	keys := append([]string{keysOf(q).Queue, stateKey(q), keysOf(q).Lock}, slots...)
	for _, k := range keys {
		ttl, err := rdb.PTTL(ctx, k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl == -1 {
			t.Errorf("key %s has no TTL", k)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		n, err := rdb.Exists(ctx, keys...).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		if time.Now().After(deadline) {
			left, _ := rdb.Keys(ctx, "sluice:*").Result()
			t.Fatalf("keys left after the bucket went idle: %v", left)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestNamesAreData: any byte string is a name, and names that differ only
// in braces or escapes never share keys; all keys of a bucket share one
// hash tag.
func TestNamesAreData(t *testing.T) {
	names := []string{"a", "{a}", "a}", "{", "}", "%7B", "%", "a b\nc", "\x00\xff", "}{", "%257B"}
	seen := map[string]string{}
	for _, n := range names {
		k := queueio.NewKeys("sluice", n)
		if prev, dup := seen[k.Queue]; dup {
			t.Fatalf("names %q and %q share keys %q", prev, n, k.Queue)
		}
		seen[k.Queue] = n
		tag := hashTag(k.Queue)
		for _, other := range []string{k.Slot + strings.SplitN("id|1", "|", 2)[0], k.Lock, k.Wake, k.Procs} {
			if hashTag(other) != tag {
				t.Fatalf("name %q: keys %q and %q have different hash tags", n, k.Queue, other)
			}
		}
		if tag != rediskey.EscapeName(n) {
			t.Fatalf("name %q: hash tag %q, want the whole escaped name %q", n, tag, rediskey.EscapeName(n))
		}
	}
}

// hashTag is Redis Cluster's rule: the text between the first '{' and the
// first '}' after it, if non-empty.
func hashTag(key string) string {
	for i := 0; i < len(key); i++ {
		if key[i] == '{' {
			for j := i + 1; j < len(key); j++ {
				if key[j] == '}' {
					if j == i+1 {
						return key
					}
					return key[i+1 : j]
				}
			}
			return key
		}
	}
	return key
}

// TestEarlySlotsArePublished: when callers ahead leave, the slots of those
// behind come earlier than the estimates they sleep on; the step publishes
// their entries on the wake channel, and only theirs.
func TestEarlySlotsArePublished(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	q := newQueue(t, rdb, protocol.Policy{Capacity: 1, RefillAmount: 1, RefillFrequency: 10 * time.Millisecond},
		queueio.Options{Lookahead: 50 * time.Millisecond, Lead: 5 * time.Millisecond})
	sub := rdb.Subscribe(ctx, keysOf(q).Wake)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription is live
		t.Fatal(err)
	}
	entries := enqueueN(t, rdb, q, 40) // estimates 10 ms apart, up to 400 ms out
	for _, e := range entries[:30] {   // the first 30 give up
		if err := q.Cancel(ctx, queue.Leaver{Entry: e}); err != nil {
			t.Fatalf("cancel: %v", err)
		}
		// Removed before it had a slot: out of the queue, no slot key.
		if _, err := rdb.LPos(ctx, keysOf(q).Queue, e, redis.LPosArgs{}).Result(); err != redis.Nil {
			t.Fatalf("cancelled %s still queued: %v", e, err)
		}
	}
	takeLock(t, rdb, q, "tok")
	r, err := scheduler.Step(ctx, rdb, q, "tok")
	if err != nil || r.Scheduled == 0 {
		t.Fatalf("step: %+v %v", r, err)
	}
	msg, err := sub.ReceiveMessage(withDeadline(t, 2*time.Second))
	if err != nil {
		t.Fatalf("no wake message: %v", err)
	}
	fields := strings.Fields(msg.Payload)
	if len(fields) != 2*r.Scheduled {
		t.Fatalf("woke %d entries, scheduled %d, all early: %q", len(fields)/2, r.Scheduled, msg.Payload)
	}
	for i := 0; i < len(fields); i += 2 {
		e, slot := fields[i], fields[i+1]
		if e != entries[30+i/2] {
			t.Fatalf("woke %q, want %q (the survivors, in order)", e, entries[30+i/2])
		}
		if raw, _ := rdb.Get(ctx, slotKey(q, e)).Result(); !strings.HasPrefix(raw, slot+" ") {
			t.Fatalf("%s published with slot %s, its slot key holds %s", e, slot, raw)
		}
	}
}

// TestLaterSlotsAreTold: a caller late for its slot takes the next one,
// ahead of the queue (retime.lua), and the slots of the callers queued
// behind come later than the estimates their entries carry. A poll says
// so (Told), and the step publishes their entries with their slots on the
// wake channel, so that they wait for the message rather than polling
// again at each new estimate; an entry whose estimate held is not
// published.
func TestLaterSlotsAreTold(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	p := protocol.Policy{Capacity: 1, RefillAmount: 1, RefillFrequency: 100 * time.Millisecond}
	// MaxWait: every arrival through enqueue.lua, with its estimate (the
	// push lane queues callers without one, and the step tells them all).
	opt := queueio.Options{Lookahead: 20 * time.Millisecond, Lead: 5 * time.Millisecond, LockTTL: 2 * time.Second, Grace: 10 * time.Second, MaxLateness: time.Second, MaxWait: time.Minute}
	q := newQueue(t, rdb, p, opt)
	opt.Lookahead = time.Second // the step gives every slot at once
	stepper := newQ(rdb, "sluice", t.Name(), []protocol.Policy{p}, opt)
	sub := rdb.Subscribe(ctx, keysOf(q).Wake)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	first, err := enqueueOne(q, "first")
	if err != nil || kindOf(first) != kGranted {
		t.Fatalf("first arrival: %+v, %v: want served at once", first, err)
	}
	entries, _ := arrive(t, q, 2) // queued, estimates 100 and 200 ms out
	if len(entries) != 2 {
		t.Fatalf("%d queued, want 2", len(entries))
	}
	// The first caller comes too late for its slot, which held no room:
	// its token is spent, and it takes the next slot, ahead of both.
	r, err := q.Retime(ctx, first.Slot, "", nil, "", false)
	if err != nil || r.Refunded || r.Claimed {
		t.Fatalf("retime = %+v, %v: want the next slot", r, err)
	}
	last, err := enqueueOne(q, "last") // arrives after: its estimate holds
	if err != nil || kindOf(last) != kQueued {
		t.Fatalf("last arrival: %+v, %v: want queued", last, err)
	}
	told := func(e string) bool {
		t.Helper()
		pr, err := q.Poll(ctx, e, false)
		if err != nil || pollKindOf(pr) != pWaiting {
			t.Fatalf("poll %s = %+v, %v: want still queued", e, pr, err)
		}
		return pr.Told
	}
	for i, e := range entries {
		if !told(e) {
			t.Errorf("queued caller %d, its slot a period past its estimate: not told", i)
		}
	}
	if told(last.Entry) {
		t.Errorf("the caller that arrived after the retime, its estimate exact: told")
	}
	takeLock(t, rdb, q, "tok")
	if st, err := scheduler.Step(ctx, rdb, stepper, "tok"); err != nil || st.Scheduled != 3 {
		t.Fatalf("step: %+v %v: want all three given slots", st, err)
	}
	msg, err := sub.ReceiveMessage(withDeadline(t, 2*time.Second))
	if err != nil {
		t.Fatalf("no wake message: %v", err)
	}
	fields := strings.Fields(msg.Payload)
	if len(fields) != 4 || fields[0] != entries[0] || fields[2] != entries[1] {
		t.Fatalf("published %q, want the two pushed back, with their slots, and not %s", msg.Payload, last.Entry)
	}
	for i := 0; i < len(fields); i += 2 {
		if raw, _ := rdb.Get(ctx, slotKey(q, fields[i])).Result(); !strings.HasPrefix(raw, fields[i+1]+" ") {
			t.Fatalf("%s published with slot %s, its slot key holds %s", fields[i], fields[i+1], raw)
		}
	}
}

// TestPollGivesSlotsWithinLookahead: a scheduler that holds the lock and
// does not step (its process starved) leaves a queued caller without its
// slot; the caller's poll a lead before its estimated slot, within the
// lookahead, does the step's work and finds its slot, in that one poll,
// before the slot comes, and the callers behind it stay queued.
func TestPollGivesSlotsWithinLookahead(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	p := protocol.Policy{Capacity: 1, RefillAmount: 1, RefillFrequency: time.Second}
	q := newQueue(t, rdb, p, queueio.Options{Lookahead: 400 * time.Millisecond, LockTTL: 2 * time.Second, MaxWait: time.Minute})
	takeLock(t, rdb, q, "a scheduler that never steps")
	if first, err := enqueueOne(q, "first"); err != nil || kindOf(first) != kGranted {
		t.Fatalf("first arrival: %+v, %v: want served at once", first, err)
	}
	enqueued := time.Now()
	entries, _ := arrive(t, q, 2) // estimates 1 s and 2 s out
	if len(entries) != 2 {
		t.Fatalf("%d queued, want 2", len(entries))
	}
	est, ok := protocol.EntryEstimate(entries[0])
	if !ok {
		t.Fatalf("entry %q: no estimate", entries[0])
	}
	// 300 ms before its estimated slot: within the lookahead.
	time.Sleep(time.Until(enqueued.Add(700 * time.Millisecond)))
	pr, err := q.Poll(ctx, entries[0], false)
	if err != nil || !pr.Found {
		t.Fatalf("poll within the lookahead = %+v, %v: want its slot", pr, err)
	}
	if pr.Slot != est {
		t.Errorf("slot %d, want its estimate %d", pr.Slot, est)
	}
	if pr.Delay <= 0 {
		t.Logf("the poll came %v after the slot (this process held up): the help then is older than this test", -pr.Delay)
	}
	if pr, err := q.Poll(ctx, entries[1], false); err != nil || pollKindOf(pr) != pWaiting {
		t.Errorf("the next caller's poll = %+v, %v: want still queued, its slot beyond the lookahead", pr, err)
	}
}

func withDeadline(t *testing.T, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(ctx, d)
	t.Cleanup(cancel)
	return c
}

// TestStepPublishesPushedCallers: an entry pushed without an estimate is
// published as soon as the step gives it a slot, whatever the slot.
func TestStepPublishesPushedCallers(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	q := newQueue(t, rdb, protocol.Policy{Capacity: 5, RefillAmount: 1, RefillFrequency: time.Millisecond}, queueio.Options{Lookahead: time.Second})
	sub := rdb.Subscribe(ctx, keysOf(q).Wake)
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	// As the push lane (queue/push.go) queues callers: without an estimate.
	rs := []queueio.Arrival{{Entry: "x|0"}, {Entry: "y|0"}}
	if err := rdb.RPush(ctx, keysOf(q).Queue, rs[0].Entry, rs[1].Entry).Err(); err != nil {
		t.Fatal(err)
	}
	takeLock(t, rdb, q, "tok")
	if r, err := scheduler.Step(ctx, rdb, q, "tok"); err != nil || r.Scheduled != 2 {
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
