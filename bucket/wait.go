// Waiting in the queue: a queued caller sleeps toward its estimated slot
// and polls for the slot the scheduler wrote.

package bucket

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/rediscall"
	"github.com/sluicehq/sluice/queue"
)

// awaitSlot sleeps until shortly before the estimated slot, then polls for
// the slot; a poll that finds none backs off and, when no scheduler holds the
// lock, starts one here. However far its slot, a caller polls at least
// every checkIn: that is how it learns that Redis is away (the poll fails)
// and fails within Enter's bound rather than at its slot. When the scheduler publishes the caller's slot
// (pushed callers always, others when the slot came earlier than their
// estimate), the caller polls a lead before that slot instead.
func (b *Bucket) awaitSlot(ctx context.Context, er queue.Arrival, enqueued time.Time, rep *entered, costs []int64, limit *time.Duration) (bool, error) {
	entry := er.Entry
	hints, forget := b.notices.register(entry)
	var switched <-chan struct{}
	unqueue := func() {}
	if b.fb != nil {
		switched, unqueue = b.fb.queue(entry, er.Ticket, costs)
	}
	keep := false // gone local: admit takes its booking, then forgets it
	gone := func() (bool, error) {
		b.cancel(entry)
		keep = true
		return false, goneLocal{entry}
	}
	dequeued := sync.OnceFunc(func() {
		if !keep {
			unqueue()
		}
		forget()
		if b.queued.Add(-1) == 0 {
			// The last caller of this process queued here learned its
			// slot, or gave up: the scheduler hands the lock over now
			// rather than at its next step.
			b.sched.Ensure()
		}
	})
	defer dequeued()
	// local places an instant of the Redis clock on this process's clock,
	// by the enqueue reply: Redis read its clock (er.Now) before the reply
	// was received (enqueued), so the result is late by at most the round
	// trip, against a lead of a quarter of the lookahead.
	local := func(us int64) time.Time { return enqueued.Add(time.Duration(us-er.Now) * time.Microsecond) }
	backoff := time.Millisecond
	wait := er.Delay - b.leadNow()
	for {
		var reach <-chan struct{}
		if b.fb != nil {
			_, reach = b.hub.Away()
		}
		slot, err := b.sleep(ctx, min(wait, checkIn), hints, switched, reach)
		if errors.Is(err, errReach) {
			if away, _ := b.hub.Away(); away && b.fb.goLocal() {
				return gone()
			}
			switched, _ = b.fb.queue(entry, er.Ticket, costs) // back on Redis meanwhile: the next switch's
			continue
		}
		if err != nil {
			b.cancel(entry)
			return false, err
		}
		if slot > 0 {
			// The scheduler gave the slot: poll a lead before it.
			if _, err := b.sleep(ctx, local(slot).Add(-b.leadNow()).Sub(b.now()), nil, switched, nil); errors.Is(err, errReach) {
				return gone()
			} else if err != nil {
				b.cancel(entry)
				return false, err
			}
		}
		cctx, done, within := rediscall.CallCtx(ctx, *limit)
		sentFn, pctx := sentAt(cctx, b.now)
		pr, err := b.q.Poll(pctx, entry)
		done()
		received := b.now()
		var sent time.Time
		if err == nil {
			sent = sentFn() // a failed call may still be stamping it
		}
		rep.Polls++
		rep.RoundTrips += max(pr.RoundTrips, 1)
		if errors.As(err, new(*queue.ConfigError)) {
			// A live change since this caller queued: poll under the
			// policies in force (the caller keeps its place).
			if _, serr := b.followInForce(ctx, err, 0); serr != nil {
				b.cancel(entry)
				return false, serr
			}
			wait = 0
			continue
		}
		if err != nil {
			if b.busy(ctx, cctx, within, err) {
				*limit = min(2**limit, time.Minute)
				wait = 0 // poll again
				continue
			}
			if b.fb != nil && b.fb.away(ctx, err) {
				return gone()
			}
			b.cancel(entry)
			return false, b.callErr(ctx, err, within)
		}
		b.rtt.observe(received.Sub(sent))
		own := b.ownWait(ctx)
		switch {
		case pr.Found && own > 0 && pr.Delay > own:
			// Its slot comes after its deadline: leave now, and pass
			// the slot on rather than sleep it out.
			dequeued()
			b.leave(queue.Leaver{Entry: entry, Room: pr.Room, Costs: costs})
			return false, b.tooLong(pr.Delay, own)
		case pr.Found:
			dequeued()
			rep.Slot = time.UnixMicro(pr.Slot)
			return b.sleepToSlot(ctx, sent, received, pr.Delay, rep, costs, entry, pr.Room)
		case pr.Stale:
			// The poll itself came too late for the slot: keep the place.
			dequeued()
			return b.retime(ctx, rep, costs, entry, pr.Room)
		case pr.Lost:
			return true, nil
		case own > 0 && pr.Delay > own:
			// Still queued, and its turn now estimated past its deadline
			// (callers ahead took longer, or late ones took slots first).
			b.cancel(entry)
			return false, b.tooLong(pr.Delay, own)
		}
		rep.Position = pr.Position
		if pr.LockTTL < 0 {
			b.sched.Ensure()
		}
		// Far from its slot (callers ahead cancelled, or the caller woke
		// early): trust the new estimate. At or past it: the scheduler is
		// late or dead; back off, but never beyond the moment its lock
		// expires, when this caller may take over.
		wait = pr.Delay - b.leadNow()
		if wait < backoff {
			wait = backoff
			if pr.LockTTL > 0 {
				wait = min(wait, pr.LockTTL+time.Millisecond)
			}
			backoff = min(2*backoff, b.cfg.LockTTL/4)
		}
	}
}

// leadNow is how long before its slot a caller polls: a quarter of the
// lookahead, or twice the round trip the client's calls take now when
// that is longer (thousands of callers polling at once), but at most half
// the lookahead, by when the scheduler has surely given the slot. A poll
// whose reply came after the slot leaves the caller late.
func (b *Bucket) leadNow() time.Duration {
	return min(max(b.lead, 2*b.hub.RoundTrip()), b.cfg.Lookahead/2)
}

// sleep waits d, or until a hint comes (then it returns the slot the hint
// gives, µs on the Redis clock; 0 when none), ctx ends or the bucket
// closes; or, with a local share, until it switched or Redis's
// reachability changed (errReach).
func (b *Bucket) sleep(ctx context.Context, d time.Duration, hints <-chan int64, switched, reach <-chan struct{}) (int64, error) {
	if d <= 0 {
		return 0, nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return 0, nil
	case slot := <-hints:
		return slot, nil
	case <-switched:
		return 0, errReach
	case <-reach:
		return 0, errReach
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-b.bg.Done():
		return 0, errClosed
	}
}
