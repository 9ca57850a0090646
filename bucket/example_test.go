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
	b, err := bucket.New(rdb, bucket.Config{Name: "report", Capacity: 1, RefillAmount: 1, RefillFrequency: 300 * time.Millisecond}) // the second caller queues for the next token
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
		fmt.Printf("queue position %d, waited ≥ 250ms: %v\n", rep.Position, rep.Wait >= 250*time.Millisecond)
	}
	// Output:
	// queue position 0, waited ≥ 250ms: false
	// queue position 1, waited ≥ 250ms: true
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
	fmt.Println(errors.Is(err, sluice.ErrWaitTooLong), errors.Is(err, sluice.ErrLimited))
	// Output:
	// <nil>
	// true true
}

// A quota on two things at once, Sentinel Hub's contract: 1,000 requests
// a minute, and processing units (PU) both 1,000 a minute and 400,000 per
// 31 days. Each request costs 1 request and some PU; all three policies
// are debited together, or none is.
func ExampleBucket_EnterCost() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	b, err := bucket.New(rdb, bucket.Config{
		Name: "sentinel-hub",
		Policies: []bucket.Policy{
			bucket.Rate(1000, time.Minute, 1000),                                                      // requests: 1 every 60 ms, burst 1,000
			{Unit: "pu", Capacity: 1000, RefillAmount: 1, RefillFrequency: 60 * time.Millisecond},     // 1,000 PU a minute
			{Unit: "pu", Capacity: 400000, RefillAmount: 1, RefillFrequency: 6696 * time.Millisecond}, // 400,000 PU per 31 days
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()

	ctx := context.Background()
	est, err := b.Estimate(ctx, bucket.Cost{"": 1, "pu": 60})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("a 60 PU request would wait:", est.Wait, "behind", est.Ahead)
	if err := b.EnterCost(ctx, bucket.Cost{"": 1, "pu": 60}); err != nil { // one request of 60 PU
		fmt.Println(err)
		return
	}
	err = b.EnterCost(ctx, bucket.Cost{"": 1, "pu": 1001}) // more PU than a minute allows: never
	fmt.Println(errors.Is(err, sluice.ErrCostExceedsCapacity), errors.Is(err, sluice.ErrLimited))
	// Output:
	// a 60 PU request would wait: 0s behind 0
	// true false
}

// A bucket that keeps admitting while Redis is unreachable: each process
// at its share of the limit, first come first served, back on Redis at
// its first answer. Report.Local (and sluice.Event.Local, for an
// Observer) marks the calls the share admitted.
func ExampleConfig_fallback() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	b, err := bucket.New(rdb, bucket.Config{
		Name:            "example-fallback",
		Capacity:        100,
		RefillAmount:    100,
		RefillFrequency: time.Second,
		Fallback:        bucket.LocalShare,
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()

	rep, err := b.EnterReport(context.Background())
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("admitted by the local share:", rep.Local)
	// Output: admitted by the local share: false
}
