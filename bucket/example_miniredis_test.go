package bucket_test

import (
	"context"
	"fmt"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
)

// Code that uses a bucket can be unit-tested on miniredis, a Redis that
// runs inside the test process: nothing to install. In a test, start it
// with miniredis.RunT(t), which closes it when the test ends. Every
// script of the bucket runs there as on Redis; the waits are real.
func Example_miniredis() {
	mr, err := miniredis.Run() // in a test: mr := miniredis.RunT(t)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer mr.Close()
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	b, err := bucket.New(rdb, bucket.Config{Name: "api", Capacity: 2, RefillAmount: 1, RefillFrequency: 20 * time.Millisecond})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()

	ctx := context.Background()
	start := time.Now()
	for range 4 {
		if err := b.Enter(ctx); err != nil {
			fmt.Println(err)
			return
		}
	}
	// Two at once, then one per refill: at least 40 ms for four.
	fmt.Println("4 calls, waited ≥ 40ms:", time.Since(start) >= 40*time.Millisecond)
	// Output: 4 calls, waited ≥ 40ms: true
}
