package bucket_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// TestSchedulerClosedWhileOthersWait: the process that runs the scheduler
// closes its Bucket while another process's callers wait. Enqueue learns
// whether a scheduler runs from the state's until, which outlives the
// released lock by up to LockTTL, so callers arriving right after the
// Close are told one runs; they and the callers already queued must still
// all be served (their first poll finds no lock and starts a scheduler),
// within the guarantee.
func TestSchedulerClosedWhileOthersWait(t *testing.T) {
	srv := redistest.New(t)
	rdbA, rdbB := srv.Client(), srv.Client()
	defer rdbA.Close()
	defer rdbB.Close()
	cfg := bucket.Config{Name: t.Name(), Capacity: 1, RefillAmount: 1, RefillFrequency: 200 * time.Millisecond,
		LockTTL: 300 * time.Millisecond, MaxLateness: -1}
	a, err := bucket.New(rdbA, cfg)
	if err != nil {
		t.Fatal(err)
	}
	b := newBucket(t, rdbB, cfg)
	ctx := withTimeout(t, 20*time.Second)

	// A takes the token, then queues a caller: A's process starts the scheduler.
	if err := a.Enter(ctx); err != nil {
		t.Fatal(err)
	}
	aDone := make(chan error, 1)
	go func() { aDone <- a.Enter(ctx) }()
	keys := keysFor(cfg)
	waitFor(t, 5*time.Second, "A's queued caller", func() bool {
		n, _ := rdbB.LLen(ctx, keys.Queue).Result()
		return n >= 1
	})
	waitFor(t, 5*time.Second, "A's scheduler to hold the lock", func() bool {
		n, _ := rdbB.Exists(ctx, keys.Lock).Result()
		return n == 1
	})

	var mu sync.Mutex
	var reps []report
	var errs []error
	var wg sync.WaitGroup
	enter := func() {
		wg.Go(func() {
			rep, err := enterReport(ctx, b)
			mu.Lock()
			defer mu.Unlock()
			reps = append(reps, rep)
			if err != nil {
				errs = append(errs, err)
			}
		})
	}
	for range 5 {
		enter()
	}
	waitFor(t, 5*time.Second, "B's callers to queue", func() bool {
		n, _ := rdbB.LLen(ctx, keys.Queue).Result()
		return n >= 5
	})

	// A closes: its scheduler releases the lock, its waiting caller leaves.
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-aDone; err != nil && !errors.Is(err, sluice.ErrClosed) {
		t.Fatalf("A's queued caller: %v, want a grant or sluice.ErrClosed", err)
	}
	// Within LockTTL of the Close: told a scheduler runs.
	for range 3 {
		enter()
	}
	wg.Wait()
	if len(errs) > 0 {
		t.Fatalf("%d of B's callers failed after A closed: %v", len(errs), errs[0])
	}
	if len(reps) != 8 {
		t.Fatalf("%d reports, want 8", len(reps))
	}
	// Each finds a scheduler within a few polls: one that found no lock
	// starts one at once. (Without that, callers told a scheduler runs
	// would back off and poll until the queue key expired, a grace later.)
	var slots []time.Time
	for _, r := range reps {
		slots = append(slots, r.Slot)
		if r.Polls > 10 || r.Reentries > 0 {
			t.Errorf("a caller of B polled %d times and re-entered %d times: no scheduler took over", r.Polls, r.Reentries)
		}
	}
	if res := guarantee.Check(slots, limitOf(cfg)); !res.OK() {
		t.Fatalf("slots broke the guarantee: %v", res)
	}
}
