package scheduler_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/internal/testing/testkit"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/scheduler"
)

// setup makes n callers arrive at once (one batch, one instant of the
// Redis clock) at a bucket of one token a millisecond and returns how many
// of them queued (the others, due within the lookahead, were served at
// once): n less about 10, however slow the test process.
func setup(t *testing.T, n int) (*redis.Client, *queue.Queue, int) {
	t.Helper()
	rdb := redistest.New(t).Client()
	t.Cleanup(func() { rdb.Close() })
	q := newQ(rdb, "sluice", t.Name(), []protocol.Policy{{Capacity: 1, RefillAmount: 1, RefillFrequency: time.Millisecond}},
		queueio.Options{Lookahead: 10 * time.Millisecond, LockTTL: 500 * time.Millisecond, Grace: 10 * time.Second, MaxLateness: time.Second})
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint("c", i)
	}
	rs, err := q.Enqueue(context.Background(), ids, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	queued := 0
	for _, r := range rs {
		if kindOf(r) == kQueued {
			queued++
		}
	}
	return rdb, q, queued
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testkit.WaitFor(t, 10*time.Second, what, cond)
}

// TestDrainsAndStops: schedulers in two "processes" compete; one leads,
// every caller gets a slot, then both goroutines end and the lock is gone.
func TestDrainsAndStops(t *testing.T) {
	rdb, q, queued := setup(t, 100)
	if queued < 50 {
		t.Fatalf("only %d of 100 queued", queued)
	}
	a := scheduler.New(rdb, q, nil)
	b := scheduler.New(rdb, q, nil)
	defer a.Close()
	defer b.Close()
	a.Ensure()
	b.Ensure()
	a.Ensure() // a second Ensure on a live goroutine starts no other
	waitFor(t, "both schedulers to end", func() bool { return !scheduler.IsRunning(a) && !scheduler.IsRunning(b) })
	if m, err := redistest.Slots(ctx, rdb, keysOf(q).Slot); err != nil || len(m) != queued {
		t.Fatalf("%d slots written for %d queued callers (%v)", len(m), queued, err)
	}
	if n, _ := rdb.Exists(ctx, keysOf(q).Lock).Result(); n != 0 {
		t.Fatal("lock still held after the queue drained")
	}
	aSteps, _, _ := a.Stats()
	bSteps, _, _ := b.Stats()
	if aSteps == 0 && bSteps == 0 {
		t.Fatal("no steps ran")
	}
}

// TestCloseReleasesLock: Close stops a scheduler mid-queue, waits for its
// goroutine and hands the lock over at once.
func TestCloseReleasesLock(t *testing.T) {
	rdb, _, _ := setup(t, 1)
	// A long queue: one token an hour.
	q := newQ(rdb, "sluice", t.Name()+"-slow", []protocol.Policy{{Capacity: 1, RefillAmount: 1, RefillFrequency: time.Hour}},
		queueio.Options{Lookahead: 10 * time.Millisecond, LockTTL: 500 * time.Millisecond, Grace: time.Second})
	for i := 0; i < 3; i++ {
		if _, err := enqueueOne(q, fmt.Sprint("c", i)); err != nil {
			t.Fatal(err)
		}
	}
	s := scheduler.New(rdb, q, nil)
	s.Ensure()
	waitFor(t, "the lock", func() bool {
		n, _ := rdb.Exists(ctx, keysOf(q).Lock).Result()
		return n == 1
	})
	s.Close()
	if scheduler.IsRunning(s) {
		t.Fatal("goroutine still running after Close")
	}
	if n, _ := rdb.Exists(ctx, keysOf(q).Lock).Result(); n != 0 {
		t.Fatal("Close did not release the lock")
	}
	s.Ensure() // after Close: does nothing
	if scheduler.IsRunning(s) {
		t.Fatal("Ensure after Close started a goroutine")
	}
}

// TestFencedSchedulerStops: a scheduler whose lock was taken over stops
// at its next step without changing anything.
func TestFencedSchedulerStops(t *testing.T) {
	rdb, _, _ := setup(t, 1)
	q := newQ(rdb, "sluice", t.Name()+"-slow", []protocol.Policy{{Capacity: 1, RefillAmount: 1, RefillFrequency: time.Hour}},
		queueio.Options{Lookahead: 10 * time.Millisecond, LockTTL: 100 * time.Millisecond, Grace: time.Second})
	for i := 0; i < 3; i++ {
		if _, err := enqueueOne(q, fmt.Sprint("c", i)); err != nil {
			t.Fatal(err)
		}
	}
	s := scheduler.New(rdb, q, nil)
	defer s.Close()
	s.Ensure()
	waitFor(t, "the lock", func() bool {
		n, _ := rdb.Exists(ctx, keysOf(q).Lock).Result()
		return n == 1
	})
	if err := rdb.Set(ctx, keysOf(q).Lock, "someone-else", time.Minute).Err(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the fenced scheduler to stop", func() bool { return !scheduler.IsRunning(s) })
	if _, fenced, _ := s.Stats(); fenced == 0 {
		t.Fatal("stopped without being fenced")
	}
	if v, _ := rdb.Get(ctx, keysOf(q).Lock).Result(); v != "someone-else" {
		t.Fatalf("the fenced scheduler touched the lock: %q", v)
	}
}
