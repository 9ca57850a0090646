package bucket

import (
	"errors"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/queueio"
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
	// full: the queue was at MaxQueue, where Redis refuses with
	// ErrQueueFull before it weighs a wait: then Redis is asked.
	full bool
}

// saw notes that a caller of the bucket's own costs whose call left for
// Redis at sent was told a slot delay after Redis's now then, and whether
// the queue was full then (full: no slot told). The latest call tells the
// back; the callers of one call, the latest of theirs.
func (k *back) saw(sent time.Time, delay time.Duration, full bool) {
	slot := sent.Add(delay)
	k.mu.Lock()
	defer k.mu.Unlock()
	switch {
	case sent.Before(k.sent):
		return
	case sent.Equal(k.sent):
		k.full = k.full || full
		if full || !slot.After(k.slot) {
			return
		}
		k.slot = slot
	default:
		k.full = full
		if !full {
			k.slot = slot
		}
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
	if !now.Before(k.until) || k.full {
		return 0, false
	}
	wait := k.slot.Sub(now)
	return wait, wait > limit
}

// learnBack notes what the reply er to an arrival of the bucket's own
// costs, whose call left at sent, says of the back (comings.learn). A queue at MaxQueue
// refuses the next caller as full, whatever its wait: the back then
// sends callers to Redis.
//
// While named lanes have callers (Arrival.Lanes), a queued caller's delay
// is its share's estimate, not the back: what was learned is forgotten,
// and callers go to Redis. The callers of named lanes are not heard: the
// back is the default lane's.
func (b *Bucket) learnBack(sent time.Time, er queueio.Arrival) {
	if er.Lanes {
		b.back.forget()
		return
	}
	full := errors.Is(er.Err, queueio.ErrQueueFull) || er.Err == nil && b.cfg.MaxQueue > 0 && er.Position >= b.cfg.MaxQueue
	if full || er.Err == nil || errors.Is(er.Err, queueio.ErrWaitTooLong) {
		b.back.saw(sent, er.Delay, full)
	}
}

// refusedHere is the refusal of a caller of the bucket's own costs whose
// own bound is own (ownWait), when the back already says it (refuses);
// nil when Redis must be asked. With MaxQueue, an arrival of this
// process in flight may fill the queue, and Redis refuses a caller as
// full before it weighs its wait: the caller joins it.
func (b *Bucket) refusedHere(own time.Duration) error {
	if b.cfg.MaxQueue > 0 && b.comings.arr.Busy() {
		return nil
	}
	if est, ok := b.back.refuses(b.now(), b.mayWait(own)); ok {
		return b.tooLong(est, own)
	}
	return nil
}
