package bucket_test

import (
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/testing/buckettest"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
	"github.com/sluicehq/sluice/internal/testing/testkit"
	"github.com/sluicehq/sluice/internal/testing/testmain"
)

var exampleAddr string

// redisAddr is where the examples' Redis listens: a throwaway redis-server
// started for this test binary, so the examples show only user code (use
// your own server's address).
func redisAddr() string { return exampleAddr }

func TestMain(m *testing.M) {
	loadgen.MaybeWorker() // worker processes of the multi-process tests
	os.Exit(testmain.Run(m, &exampleAddr))
}

// newBucket makes a bucket named after the test and closes it at cleanup.
var newBucket = buckettest.New

func limitOf(cfg bucket.Config) guarantee.Limit {
	return guarantee.Limit{Capacity: cfg.Capacity, RefillAmount: cfg.RefillAmount, RefillFrequency: cfg.RefillFrequency}
}

// enterAll runs callers goroutines, each entering n times, and returns the
// grants.
func enterAll(ctx context.Context, b *bucket.Bucket, callers, n int) []loadgen.Grant {
	var mu sync.Mutex
	var out []loadgen.Grant
	loadgen.Run(ctx, b, loadgen.Spec{Callers: callers, Enters: n}, func(g loadgen.Grant) {
		mu.Lock()
		out = append(out, g)
		mu.Unlock()
	})
	return out
}

// checkGrants fails t if any Enter failed or a promise was broken:
//   - the slots, on the Redis clock, keep the guarantee exactly;
//   - no caller starts before its slot (Redis and this test share the
//     machine's clock, so the two can be compared);
//   - start times, as the upstream would see them, keep the guarantee
//     with windows widened by the lateness bound (MaxLateness plus a
//     margin for the reply's trip): a late caller cannot bunch up.
func checkGrants(t *testing.T, grants []loadgen.Grant, cfg bucket.Config) guarantee.Result {
	t.Helper()
	var starts, slots []time.Time
	var errs []string
	early := 0
	for _, g := range grants {
		if !g.OK() {
			errs = append(errs, g.Err)
			continue
		}
		starts = append(starts, g.Time())
		slots = append(slots, g.SlotTime())
		if g.Time().Before(g.SlotTime().Add(-100 * time.Microsecond)) {
			early++
		}
	}
	if len(errs) > 0 {
		t.Errorf("%d of %d Enters failed, first: %s", len(errs), len(grants), errs[0])
	}
	if early > 0 {
		t.Errorf("%d callers started before their slot", early)
	}
	l := limitOf(cfg)
	if res := guarantee.Check(slots, l); !res.OK() {
		t.Errorf("guarantee broken by the slots: %v", res)
	}
	late := cfg.MaxLateness // as New reads it
	if late == 0 {
		late = bucket.DefaultMaxLateness
	}
	slack := max(late, 0) + 2*time.Millisecond
	res := guarantee.CheckSlack(starts, l, slack)
	if !res.OK() {
		t.Errorf("guarantee broken by the start times (slack %v): %v", slack, res)
	}
	return guarantee.Check(starts, l)
}

// waitFor polls cond until it holds, failing t after within.
var waitFor = testkit.WaitFor

// keysFor returns the keys of the bucket cfg describes.
func keysFor(cfg bucket.Config) bucket.TestKeys { return bucket.KeysFor(cfg) }

// keysOf lists the Redis keys of a bucket.
func keysOf(t *testing.T, rdb *redis.Client, b *bucket.Bucket) []string {
	t.Helper()
	prefix, _, _ := strings.Cut(bucket.Keys(b).Queue, "}")
	keys, err := rdb.Keys(context.Background(), escapeGlob(prefix)+"}*").Result()
	if err != nil {
		t.Fatal(err)
	}
	return keys
}

func escapeGlob(s string) string {
	r := strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`, `]`, `\]`)
	return r.Replace(s)
}
