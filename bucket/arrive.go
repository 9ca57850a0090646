// The arrival: a caller's entry (enter, the loop over its arrivals) and
// each arrival at Redis (enterOnce), bounded by what the caller may wait.

package bucket

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/enterdetail"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/internal/rediscall"
	"github.com/sluicehq/sluice/internal/verdict"
	"github.com/sluicehq/sluice/queue"
)

// enter enters a caller of cost c (nil: Enter's). Its costs per policy are
// taken anew for each arrival: a live change may have changed the
// policies in force meanwhile.
func (b *Bucket) enter(ctx context.Context, c Cost) (rep entered, err error) {
	if b.shadow != nil {
		return b.shadow.enter(ctx, c, false)
	}
	start := b.now()
	b.tally.Begin()
	defer func() { b.ended(ctx, start, rep, err) }()
	defer b.fb.begin()()
	limit := b.answerWithin()
	for settled := 0; ; {
		select {
		case <-b.bg.Done():
			return rep, errClosed
		default:
		}
		costs, stop, err := b.costsOf(ctx, c)
		if stop {
			return rep, err
		}
		if _, err := b.laneOf(ctx); err != nil {
			return rep, err // nothing queued
		}
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		if b.fb.serving() {
			if err := b.fb.admit(ctx, "", costs, &rep.Report); err != errBack {
				rep.Wait = b.now().Sub(start)
				return rep, err
			}
		}
		again, err := b.enterOnce(ctx, costs, &rep, &limit)
		var gone goneLocal
		if errors.As(err, &gone) {
			if err = b.fb.admit(ctx, gone.entry, costs, &rep.Report); err == errBack {
				continue // back on Redis before this caller booked
			}
			rep.Wait = b.now().Sub(start)
			return rep, err
		}
		if retry, serr := b.followInForce(ctx, err, settled); retry {
			settled++
			continue
		} else if serr != nil {
			err = serr
		}
		if !again {
			rep.Wait = b.now().Sub(start)
			if err == nil && b.cfg.Adapt {
				b.maybeAdaptUp()
			}
			return rep, err
		}
		rep.Reentries++
	}
}

// ended counts the end of enter's call that began at start, with its
// report and error, and copies its detail to the enterdetail.Detail the
// ctx carries, if any.
func (b *Bucket) ended(ctx context.Context, start time.Time, rep entered, err error) {
	res, why := verdict.Classify(ctx, err, reasons...)
	b.tally.End(sluice.Event{Lane: eventLane(ctx), Result: res, Reason: why, Wait: b.now().Sub(start), Queued: rep.Position > 0 && res != sluice.Refused, Late: rep.Late, Reentries: rep.Reentries, Local: rep.Local})
	if d := enterdetail.From(ctx); d != nil {
		*d = rep.Detail
	}
}

// costsOf is what a caller of cost c (nil: Enter's) takes from each
// policy in force. stop: the caller returns now with err, as c is
// invalid, or takes nothing (err is then ctx's).
func (b *Bucket) costsOf(ctx context.Context, c Cost) (costs []int64, stop bool, err error) {
	if c == nil {
		if err := b.countsCalls(); err != nil {
			return nil, true, err
		}
	}
	if c != nil {
		var zero bool
		if costs, zero, err = b.costs(c); err != nil || zero {
			if err == nil {
				err = ctx.Err()
			}
			return nil, true, err
		}
	}
	if costs == nil && trying(ctx) {
		costs = b.tryCosts()
	}
	return costs, false, nil
}

// countsCalls refuses Enter's cost (a nil Cost: 1 call) on a bucket none
// of whose policies in force counts calls: it would take nothing, and
// every caller would pass at once, unlimited.
func (b *Bucket) countsCalls() error {
	if slices.ContainsFunc(b.inForce(), func(p Policy) bool { return p.Unit == "" }) {
		return nil
	}
	return fmt.Errorf("bucket %q: Enter's cost is 1 call, but no policy in force counts calls (Unit \"\"): enter with EnterCost, or Reserve, and a cost in its units (%w)", b.cfg.Name, sluice.ErrConfig)
}

// enterOnce makes one arrival with a fresh ID. It reports again when the
// caller must arrive anew (its slot went stale or was lost).
//
// limit bounds each of its calls to Redis (rediscall.CallCtx): it doubles
// each time a call runs out of it while Redis answers a PING (busy), so
// that a slow Redis is waited for and a frozen one is not.
func (b *Bucket) enterOnce(ctx context.Context, costs []int64, rep *entered, limit *time.Duration) (again bool, err error) {
	sfx, err := b.laneOf(ctx)
	if err != nil {
		return false, err
	}
	id := b.newID() + sfx
	own := b.ownWait(ctx)
	if costs == nil && sfx == "" { // the back is the default lane's
		if err := b.refusedHere(own); err != nil {
			return false, err // as Redis would: no round trip
		}
	}
	cctx, done, within := rediscall.CallCtx(ctx, *limit)
	er, sent, err := b.comings.enqueue(cctx, id, costs, own)
	done()
	received := b.now()
	rep.RoundTrips++
	if errors.As(err, new(*queueio.ConfigError)) {
		return false, err // nothing was written: settle it
	}
	if err != nil {
		if ctx.Err() != nil || errors.Is(cctx.Err(), context.DeadlineExceeded) || errors.Is(err, queue.ErrNotReplicated) {
			b.cancel(id) // it may have arrived before the caller gave up
		}
		if b.busy(ctx, cctx, within, err) {
			*limit = min(2**limit, time.Minute)
			return true, nil // arrive again
		}
		if b.fb.away(ctx, err) {
			return false, goneLocal{}
		}
		return false, b.callErr(ctx, err, within)
	}
	b.rtt.observe(received.Sub(sent)) // only replies: a failed call says nothing of the network
	b.hub.Replied(sent)
	rep.Ticket, rep.Position = er.Ticket, er.Position
	if er.Now > 0 {
		rep.Arrived = time.UnixMicro(er.Now)
	}
	switch {
	case errors.Is(er.Err, queueio.ErrQueueFull):
		return false, fmt.Errorf("%w (%d waiting)", errQueueFull, er.Position)
	case errors.Is(er.Err, queueio.ErrWaitTooLong):
		return false, b.tooLong(er.Delay, own)
	case er.Entry == "": // its slot at once
		rep.Slot = time.UnixMicro(er.Slot)
		return b.written(ctx, rep, costs, limit)(b.sleepToSlot(ctx, sent, received, er.Delay, rep, costs, "", ""))
	}
	if own > 0 && er.Delay > own && sfx == "" && !er.Lanes {
		// Pushed (queue.Enqueue's push lane cannot refuse): leave at once.
		// (With named lanes the delay is a share's estimate; enqueue.lua
		// judged the wait on the caller's own lane, which is a bound.)
		// It was the back: gone, the next caller takes its place, which
		// is what the back now says (no forget).
		b.comings.leave(queue.Leaver{Entry: er.Entry})
		return false, b.tooLong(er.Delay, own)
	}
	b.queuedNow(er)
	return b.written(ctx, rep, costs, limit)(b.awaitSlot(ctx, er, received, rep, costs, limit))
}

// queuedNow counts a caller that queued (er). The first of this process
// to queue makes sure a scheduler runs even when the reply says one
// does: it may be this process's, handing the lock over because it had
// no caller queued (its last step and this arrival crossed). A place
// beyond every caller of this handle in Enter (each holds one place at
// most) shows other handles' callers queued (sawOthers).
func (b *Bucket) queuedNow(er queueio.Arrival) {
	if b.queued.Add(1) == 1 || !er.SchedulerRunning {
		b.sched.Ensure()
	}
	if int64(er.Position) > b.tally.Waiting() {
		b.sawOthers()
	}
}

// written takes a wait's outcome (again, err) and, for as long as it is
// a late caller's next slot written rather than told (writtenSlot), has
// the caller poll for that slot (awaitWritten): the loop that keeps a
// caller retimed time after time at one depth.
func (b *Bucket) written(ctx context.Context, rep *entered, costs []int64, limit *time.Duration) func(bool, error) (bool, error) {
	return func(again bool, err error) (bool, error) {
		for {
			var ws writtenSlot
			if !errors.As(err, &ws) {
				return again, err
			}
			again, err = b.awaitWritten(ctx, ws, rep, costs, limit)
		}
	}
}

// ownWait is the longest a caller may wait for its slot: until its ctx's
// deadline, less the trip a reply takes (a slot at the deadline would
// find the caller gone), and at least 1 µs (with nothing left, only a
// token free at once serves it). 0: no deadline.
func (b *Bucket) ownWait(ctx context.Context) time.Duration {
	if trying(ctx) {
		return tryWait
	}
	dl, ok := ctx.Deadline()
	if !ok {
		return 0
	}
	return max(dl.Sub(b.now())-b.rtt.min(), time.Microsecond)
}

// mayWait is the longest a caller whose own bound is own (ownWait; 0:
// none) may wait: own or MaxWait, whichever is shorter; 0: no bound.
func (b *Bucket) mayWait(own time.Duration) time.Duration {
	if own > 0 && (b.cfg.MaxWait <= 0 || own < b.cfg.MaxWait) {
		return own
	}
	return max(b.cfg.MaxWait, 0)
}

// tooLong is the refusal of a caller whose estimated wait est passes what
// it may wait: own (ownWait; 0: none) or MaxWait, whichever is shorter.
func (b *Bucket) tooLong(est, own time.Duration) error {
	e := &sluice.WaitTooLongError{Limiter: "bucket", Name: b.cfg.Name, Wait: est, Limit: b.cfg.MaxWait, Err: errWaitTooLong}
	if own > 0 && (b.cfg.MaxWait <= 0 || own < b.cfg.MaxWait) {
		e.Limit, e.Deadline = own, true
	}
	return e
}
