package bucket

import (
	"sync"
	"time"
)

// backFresh is how long what an arrival's reply said of the queue's back
// lets later callers of this process be refused without asking Redis.
const backFresh = 100 * time.Millisecond

// back is the queue's back as this process last learned it: the slot the
// last caller of the bucket's own costs to arrive was told (queued, at
// once, or refused: the one it would have had). Callers who arrive after
// it come after that slot, unless callers ahead of them leave. So a
// caller with a deadline that comes before it is refused at once, without
// a round trip, as Redis would refuse it (enqueue.lua counts no leaver
// either), while what was learned is fresh (backFresh) and no caller of
// this process has left since. On a queue deeper than its callers'
// deadlines (a service under load, each request with a budget), the
// calls that cannot be served fail in microseconds, and only those that
// may be served go to Redis.
type back struct {
	mu    sync.Mutex
	sent  time.Time // when the call that told it left for Redis
	slot  time.Time // the back's slot, on this process's clock: at least sent plus the delay Redis told
	until time.Time // when it stops serving
}

// saw notes that a caller of the bucket's own costs whose call left for
// Redis at sent was told a slot delay after Redis's now then. The latest
// call tells the back; the callers of one call, the latest of theirs.
func (k *back) saw(sent time.Time, delay time.Duration) {
	slot := sent.Add(delay)
	k.mu.Lock()
	defer k.mu.Unlock()
	switch {
	case sent.Before(k.sent):
		return
	case sent.Equal(k.sent) && !slot.After(k.slot):
	default:
		k.slot = slot
	}
	k.sent, k.until = sent, sent.Add(backFresh)
}

// forget drops what was learned: a caller left, and the back may be
// earlier than it said.
func (k *back) forget() {
	k.mu.Lock()
	k.until = time.Time{}
	k.mu.Unlock()
}

// refuses reports whether a caller of the bucket's own costs arriving at
// now, who may wait at most limit (0: no bound), would be refused by
// Redis as the back stands, and its wait then at least.
func (k *back) refuses(now time.Time, limit time.Duration) (time.Duration, bool) {
	if limit <= 0 {
		return 0, false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if !now.Before(k.until) {
		return 0, false
	}
	wait := k.slot.Sub(now)
	return wait, wait > limit
}
