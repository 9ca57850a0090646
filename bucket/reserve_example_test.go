package bucket_test

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
)

// An LLM API's two limits, 500 requests and 200,000 tokens a minute: a
// call's output tokens are known only from its response, so the call
// reserves what it may use at most (its prompt and max_tokens) and
// settles what the response says it used. The tokens it did not use go
// back to the callers waiting at once.
func ExampleBucket_Reserve() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	b, err := bucket.New(rdb, bucket.Config{
		Name: "llm-api",
		Policies: []bucket.Policy{
			bucket.Rate(500, time.Minute, 500), // requests
			{Unit: "tokens", Capacity: 200000, RefillAmount: 10, RefillFrequency: 3 * time.Millisecond}, // 200,000 a minute
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()

	ctx := context.Background()
	prompt, maxTokens := 1200, 800
	r, err := b.Reserve(ctx, bucket.Cost{"": 1, "tokens": prompt + maxTokens}) // waits its turn
	if err != nil {
		fmt.Println(err)
		return
	}
	used := prompt + 312                                               // what the response's usage said
	if err := r.Settle(ctx, bucket.Cost{"tokens": used}); err != nil { // the request stays counted
		fmt.Println(err)
		return
	}
	fmt.Println("charged", used, "tokens of the", r.Estimate()["tokens"], "reserved")
	// Output:
	// charged 1512 tokens of the 2000 reserved
}
