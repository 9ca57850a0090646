// Package buckettest makes the buckets that tests of other packages need:
// one call that names the bucket after the test, fails the test on a
// configuration error and closes the bucket at cleanup. It is apart from
// testkit because it imports bucket, and testkit depends on no package of
// this module.
package buckettest

import (
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
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
