package scheduler_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/scheduler"
)

// A caller queues; the scheduler gives it a slot, finds the queue empty,
// releases the lock and ends.
func Example() {
	srv, err := redistest.Start()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()
	q := queue.New(rdb, "sluice", "docs", []queue.Policy{{Capacity: 1, Amount: 1, Every: 50 * time.Millisecond}},
		queue.Options{Lookahead: 10 * time.Millisecond, LockTTL: time.Second, Grace: 10 * time.Second, Tolerance: time.Second})
	ctx := context.Background()
	q.Enqueue(ctx, "first")               // granted
	second, _ := q.Enqueue(ctx, "second") // queued: its token is due in 50 ms

	s := scheduler.New(rdb, q, time.Second, 10*time.Millisecond)
	defer s.Close()
	s.Ensure()
	for s.Running() {
		time.Sleep(5 * time.Millisecond)
	}
	r, _ := q.Poll(ctx, second.Entry)
	fmt.Println(r.Kind == queue.Slot)
	// Output: true
}
