package queue_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/queue"
)

// A caller arrives at a new bucket and is granted at once; the next one,
// with the bucket empty, queues and learns its estimated wait. (Package
// bucket does all of this for you: this is what it does underneath. The
// options, keys and policies are internal/queueio's and internal/protocol's,
// so only this module can build a Queue.)
func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer rdb.Close()

	q := queue.New(rdb, queueio.Options{
		Keys:      queueio.NewKeys("sluice", "docs"),
		Policies:  []protocol.Policy{{Capacity: 1, RefillAmount: 1, RefillFrequency: time.Minute}},
		Lookahead: 20 * time.Millisecond,
		LockTTL:   time.Second,
		Grace:     10 * time.Second,
	})
	ctx := context.Background()
	arrivals, err := q.Enqueue(ctx, []string{"caller-1", "caller-2"}, nil, nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	first, second := arrivals[0], arrivals[1]
	fmt.Println(first.Err == nil && first.Entry == "" && first.Delay == 0) // granted now
	fmt.Println(second.Entry != "", second.Position, second.Delay.Round(time.Second))
	fmt.Println(q.Options().Keys.Queue)
	// Output:
	// true
	// true 1 1m0s
	// sluice:{docs}:queue
}
