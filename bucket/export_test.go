package bucket

import "time"

// SkewClock makes b's local clock read d off the real time, as a host
// whose clock is wrong would.
func SkewClock(b *Bucket, d time.Duration) {
	b.now = func() time.Time { return time.Now().Add(d) }
}

// NewID exposes the ID of the next arrival.
func NewID(b *Bucket) string { return b.newID() }

// MinRoundTrip exposes the shortest recent round trip the Bucket has seen.
func MinRoundTrip(b *Bucket) time.Duration { return b.rtt.min() }
