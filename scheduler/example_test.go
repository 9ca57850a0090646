package scheduler_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/scheduler"
)

// A caller queues; the scheduler gives it a slot, finds the queue empty,
// releases the lock and ends. (Package bucket does all of this for you:
// this is what it does underneath. The queue's options are
// internal/queueio's, so only this module can build one.)
func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	q := queue.New(rdb, queueio.Options{
		Keys:        queueio.NewKeys("sluice", "docs-scheduler"),
		Policies:    []protocol.Policy{{Capacity: 1, RefillAmount: 1, RefillFrequency: 50 * time.Millisecond}},
		Lookahead:   10 * time.Millisecond,
		LockTTL:     time.Second,
		Grace:       10 * time.Second,
		MaxLateness: time.Second,
	})
	ctx := context.Background()
	arrivals, err := q.Enqueue(ctx, []string{"first", "second"}, nil, nil) // first: granted; second: queued
	if err != nil {
		fmt.Println(err)
		return
	}
	second := arrivals[1]

	s := scheduler.New(rdb, q, nil)
	defer s.Close()
	s.Ensure()
	for {
		r, err := q.Poll(ctx, second.Entry, false)
		if err != nil || r.Found || r.Lost || r.Stale {
			fmt.Println(r.Found, err)
			break
		}
		time.Sleep(max(r.Delay/2, time.Millisecond))
	}
	// Output: true <nil>
}
