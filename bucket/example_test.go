package bucket_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
)

func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	b, err := bucket.New(rdb, bucket.Config{
		Name:            "example-api",
		Capacity:        2,                     // a burst of 2 ...
		RefillAmount:    1,                     // ... then 1 more
		RefillFrequency: 20 * time.Millisecond, // every 20 ms
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()

	ctx := context.Background()
	start := time.Now()
	for i := 0; i < 4; i++ {
		if err := b.Enter(ctx); err != nil {
			fmt.Println(err)
			return
		}
	}
	// Two at once, then one per refill: at least 40 ms for four.
	fmt.Println("4 calls, waited ≥ 40ms:", time.Since(start) >= 40*time.Millisecond)
	// Output: 4 calls, waited ≥ 40ms: true
}

func ExampleBucket_EnterReport() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	b, err := bucket.New(rdb, bucket.Config{Name: "report", Capacity: 1, RefillAmount: 1, RefillFrequency: 300 * time.Millisecond,
		Lookahead: 100 * time.Millisecond}) // the second caller queues, and its slot is assigned well before it polls
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()

	for i := 0; i < 2; i++ {
		rep, err := b.EnterReport(context.Background())
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("round trips %d, polls %d\n", rep.RoundTrips, rep.Polls)
	}
	// Output:
	// round trips 1, polls 0
	// round trips 2, polls 1
}

func ExampleConfig_maxWait() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	b, err := bucket.New(rdb, bucket.Config{
		Name: "hourly", Capacity: 1, RefillAmount: 1, RefillFrequency: time.Hour,
		MaxWait: time.Second, // rather fail at once than wait longer
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()
	ctx := context.Background()
	fmt.Println(b.Enter(ctx))
	err = b.Enter(ctx)
	fmt.Println(errors.Is(err, bucket.ErrWaitTooLong), errors.Is(err, sluice.ErrLimited))
	// Output:
	// <nil>
	// true true
}
