package bucket

import (
	"time"

	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/internal/rediskey"
)

// SkewClock makes b's local clock read d off the real time, as a host
// whose clock is wrong would.
func SkewClock(b *Bucket, d time.Duration) {
	b.now = func() time.Time { return time.Now().Add(d) }
}

// NewID exposes the ID of the next arrival.
func NewID(b *Bucket) string { return b.newID() }

// MinRoundTrip exposes the shortest recent round trip the Bucket has seen.
func MinRoundTrip(b *Bucket) time.Duration { return b.rtt.min() }

// TestKeys are the Redis keys of a bucket that the tests read or write.
type TestKeys struct {
	Queue, State, Slot, Lock, Config string
}

// testKeys are k's that the tests read.
func testKeys(k queueio.Keys) TestKeys {
	return TestKeys{Queue: k.Queue, State: k.State, Slot: k.Slot, Lock: k.Lock, Config: k.Config}
}

// Keys exposes the Redis keys of b's bucket.
func Keys(b *Bucket) TestKeys { return testKeys(b.keys) }

// Defaults, for tests that spell them out.
const (
	DefaultMaxLateness = defaultMaxLateness
	DefaultKeyPrefix   = rediskey.DefaultPrefix
)

// KeysFor is the keys of the bucket cfg describes (KeyPrefix "" is the
// default's).
func KeysFor(cfg Config) TestKeys {
	prefix := cfg.KeyPrefix
	if prefix == "" {
		prefix = rediskey.DefaultPrefix
	}
	return testKeys(queueio.NewKeys(prefix, cfg.Name))
}
