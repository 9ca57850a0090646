// Package buckettest makes the buckets that tests of other packages need:
// one call that names the bucket after the test, fails the test on a
// configuration error and closes the bucket at cleanup. It is apart from
// testkit because it imports bucket, and testkit depends on no package of
// this module.
package buckettest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/testing/testkit"
)

// New makes a bucket on rdb from cfg, named after the test unless
// cfg.Name is set, fails t if bucket.New returns an error, and closes the
// bucket when the test and its subtests finish.
func New(t testing.TB, rdb redis.UniversalClient, cfg bucket.Config) *bucket.Bucket {
	t.Helper()
	if cfg.Name == "" {
		cfg.Name = t.Name()
	}
	b, err := bucket.New(rdb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// Queue starts, for each lane of lanes ("" the default lane), that many
// callers of b's Enter in it, and returns once b.Inspect counts them all
// queued, with the callers queued before (at most within 10 s, or t
// fails). b must be a bucket that
// serves none of them (empty, with a refill far off); nor may the callers
// have a deadline, or they would be refused at once. They leave when the
// test ends, before b is closed if b was made before Queue was called.
func Queue(t testing.TB, b *bucket.Bucket, lanes map[string]int) {
	t.Helper()
	before, err := b.Inspect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	want := before.Queued
	for name, n := range lanes {
		lctx := ctx
		if name != "" {
			lctx = bucket.WithLane(ctx, name)
		}
		want += n
		for range n {
			wg.Go(func() {
				if err := b.Enter(lctx); !errors.Is(err, context.Canceled) {
					t.Errorf("a caller held in lane %q: Enter = %v, want context.Canceled", name, err)
				}
			})
		}
	}
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	testkit.WaitFor(t, 10*time.Second, fmt.Sprintf("%d callers queued", want-before.Queued), func() bool {
		in, err := b.Inspect(context.Background())
		return err == nil && in.Queued == want
	})
}
