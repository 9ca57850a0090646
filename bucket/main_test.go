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
//   - no caller started later after its slot than MaxLateness, by the
//     bucket's own measure (Report.Late: a later one is retimed), so
//     that late callers cannot bunch up.
//
// The test process's wall-clock returns from Enter are not judged
// against the limit: beside a busy loop, a goroutine the bucket let
// start on time may run much later, which says nothing of the bucket.
func checkGrants(t *testing.T, grants []loadgen.Grant, cfg bucket.Config) {
	t.Helper()
	var slots []time.Time
	var errs []string
	early, tooLate := 0, 0
	late := cfg.MaxLateness // as New reads it
	if late == 0 {
		late = bucket.DefaultMaxLateness
	}
	for _, g := range grants {
		if !g.OK() {
			errs = append(errs, g.Err)
			continue
		}
		slots = append(slots, g.SlotTime())
		if g.Time().Before(g.SlotTime().Add(-100 * time.Microsecond)) {
			early++
		}
		if late >= 0 && !g.Local && time.Duration(g.Late) > late {
			tooLate++
		}
	}
	if len(errs) > 0 {
		t.Errorf("%d of %d Enters failed, first: %s", len(errs), len(grants), errs[0])
	}
	if early > 0 {
		t.Errorf("%d callers started before their slot", early)
	}
	if tooLate > 0 {
		t.Errorf("%d callers started more than MaxLateness (%v) after their slot, by the bucket's measure", tooLate, late)
	}
	if res := guarantee.Check(slots, limitOf(cfg)); !res.OK() {
		t.Errorf("guarantee broken by the slots: %v", res)
	}
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
