package queue_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/queue"
)

// A caller arrives at a new bucket and is granted at once; the next one,
// with the bucket empty, queues and learns its estimated wait.
func Example() {
	srv, err := redistest.Start()
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr()})
	defer rdb.Close()

	q := queue.New(rdb, "sluice", "docs", []queue.Policy{{Capacity: 1, Amount: 1, Every: time.Minute}},
		queue.Options{Lookahead: 20 * time.Millisecond, LockTTL: time.Second, Grace: 10 * time.Second})
	ctx := context.Background()
	first, _ := q.Enqueue(ctx, "caller-1")
	second, _ := q.Enqueue(ctx, "caller-2")
	fmt.Println(first.Kind == queue.Granted)
	fmt.Println(second.Kind == queue.Queued, second.Position, second.Delay.Round(time.Second))
	fmt.Println(q.Keys().Queue)
	// Output:
	// true
	// true 1 1m0s
	// sluice:{docs}:queue
}
