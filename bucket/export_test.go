package bucket

import (
	"time"

	"github.com/sluicehq/sluice/internal/groundwork"
	"github.com/sluicehq/sluice/queue"
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

// Keys exposes the Redis keys of b's bucket.
func Keys(b *Bucket) queue.Keys { return b.q.Keys() }

// Defaults, for tests that spell them out.
const (
	DefaultMaxLateness = defaultMaxLateness
	DefaultKeyPrefix   = groundwork.DefaultKeyPrefix
)

// KeysFor is the keys of the bucket cfg describes (KeyPrefix "" is the
// default's).
func KeysFor(cfg Config) queue.Keys {
	prefix := cfg.KeyPrefix
	if prefix == "" {
		prefix = groundwork.DefaultKeyPrefix
	}
	return queue.New(nil, prefix, cfg.Name, queue.Options{}).Keys()
}
