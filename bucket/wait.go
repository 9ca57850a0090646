// Waiting in the queue: a queued caller sleeps toward its estimated slot
// and polls for the slot the scheduler wrote.

package bucket

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/queueio"
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
//
// Each round is three steps: sleepToPoll, pollSlot, and afterPoll, which
// acts on the reply (the caller's wait ends, or it sets the next poll).
func (b *Bucket) awaitSlot(ctx context.Context, er queueio.Arrival, enqueued time.Time, rep *entered, costs []int64, limit *time.Duration) (bool, error) {
	w := &waiting{er: er, entry: er.Entry, enqueued: enqueued, rep: rep, costs: costs, limit: limit}
	var forget func()
	w.hints, forget = b.notices.register(w.entry, er.Ticket)
	var unqueue func()
	w.switched, unqueue = b.fb.queue(w.entry, er.Ticket, costs)
	w.dequeued = sync.OnceFunc(func() {
		if !w.keep {
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
	defer w.dequeued()
	w.backoff = time.Millisecond
	w.wait = er.Delay - b.leadNow()
	if er.Claim {
		w.wait = 0
	}
	for {
		if repeat, err := b.sleepToPoll(ctx, w); err != nil {
			return false, err
		} else if repeat {
			continue
		}
		pr, sent, received, repeat, err := b.pollSlot(ctx, w)
		if err != nil {
			return false, err
		} else if repeat {
			continue
		}
		if done, again, err := b.afterPoll(ctx, w, pr, sent, received); done {
			return again, err
		}
	}
}

// waiting is what awaitSlot keeps of one queued caller from step to step:
// its arrival, how it hears of its slot and of a switch to the local
// share, how it leaves the queue, and when it polls next.
type waiting struct {
	er       queueio.Arrival
	entry    string
	enqueued time.Time // when the enqueue reply was received
	rep      *entered
	costs    []int64
	limit    *time.Duration // bounds each poll (enterOnce's limit)
	hints    <-chan int64
	switched <-chan struct{}
	keep     bool   // gone local: admit takes its booking, then forgets it
	dequeued func() // once: the caller learned its slot, or gave up
	backoff  time.Duration
	wait     time.Duration // until the next poll
	poked    bool          // told to poll now, to claim (notices.poke)
}

// local places an instant of the Redis clock on this process's clock,
// by the enqueue reply: Redis read its clock (er.Now) before the reply
// was received (enqueued), so the result is late by at most the round
// trip, against a lead of a quarter of the lookahead.
func (w *waiting) local(us int64) time.Time {
	return w.enqueued.Add(time.Duration(us-w.er.Now) * time.Microsecond)
}

// gone takes a caller that goes to the local share out of the queue; its
// error tells enter to admit it there.
func (b *Bucket) gone(w *waiting) error {
	b.cancel(w.entry)
	w.keep = true
	return goneLocal{w.entry}
}

// sleepToPoll sleeps until the caller's next poll: w.wait (at most
// checkIn), or a lead before the slot a hint gives. repeat: Redis's
// reachability changed while the caller stays on Redis (sleep again); an
// error: the caller leaves with it (its ctx ended, the bucket closed, or
// it went to the local share).
func (b *Bucket) sleepToPoll(ctx context.Context, w *waiting) (repeat bool, err error) {
	slot, err := b.sleep(ctx, min(w.wait, checkIn), w.hints, w.switched, b.fb.reach())
	w.poked = slot == pollNow
	if errors.Is(err, errReach) {
		if away, _ := b.hub.Away(); away && b.fb.goLocal() {
			return false, b.gone(w)
		}
		w.switched, _ = b.fb.queue(w.entry, w.er.Ticket, w.costs) // back on Redis meanwhile: the next switch's
		return true, nil
	}
	if err != nil {
		b.cancel(w.entry)
		return false, err
	}
	if slot > 0 && !w.poked {
		// The scheduler gave the slot: poll a lead before it.
		if _, err := b.sleep(ctx, w.local(slot).Add(-b.leadNow()).Sub(b.now()), nil, w.switched, nil); errors.Is(err, errReach) {
			return false, b.gone(w)
		} else if err != nil {
			b.cancel(w.entry)
			return false, err
		}
	}
	return false, nil
}

// pollSlot polls once for the caller's slot, the call bounded by w.limit.
// repeat: poll again at once (a live change was followed, or Redis was
// slow and the limit doubled); an error: the caller leaves with it. Else
// pr is the reply, and Redis's now lies between sent and received.
func (b *Bucket) pollSlot(ctx context.Context, w *waiting) (pr queueio.PollReply, sent, received time.Time, repeat bool, err error) {
	cctx, done, within := rediscall.CallCtx(ctx, *w.limit)
	sentFn, pctx := sentAt(cctx, b.now)
	pr, err = b.q.Poll(pctx, w.entry, w.poked)
	done()
	received = b.now()
	if err == nil {
		sent = sentFn() // a failed call may still be stamping it
	}
	w.rep.Polls++
	w.rep.RoundTrips += max(pr.RoundTrips, 1)
	if errors.As(err, new(*queueio.ConfigError)) {
		// A live change since this caller queued: poll under the
		// policies in force (the caller keeps its place).
		if _, serr := b.followInForce(ctx, err, 0); serr != nil {
			b.cancel(w.entry)
			return pr, sent, received, false, serr
		}
		w.wait = 0
		return pr, sent, received, true, nil
	}
	if err != nil {
		if b.busy(ctx, cctx, within, err) {
			*w.limit = min(2**w.limit, time.Minute)
			w.wait = 0 // poll again
			return pr, sent, received, true, nil
		}
		if b.fb.away(ctx, err) {
			return pr, sent, received, false, b.gone(w)
		}
		b.cancel(w.entry)
		return pr, sent, received, false, b.callErr(ctx, err, within)
	}
	b.rtt.observe(received.Sub(sent))
	b.hub.Replied(sent)
	return pr, sent, received, false, nil
}

// afterPoll acts on a poll's reply. done: the caller's wait ends here,
// and awaitSlot returns again and err (it found its slot and slept to it,
// or was retimed, or leaves, or must arrive anew). Else the caller is
// still queued, and w.wait is when it polls next.
func (b *Bucket) afterPoll(ctx context.Context, w *waiting, pr queueio.PollReply, sent, received time.Time) (done, again bool, err error) {
	own := b.ownWait(ctx)
	switch {
	case pr.Found && own > 0 && pr.Delay > own:
		// Its slot comes after its deadline: leave now, and pass
		// the slot on rather than sleep it out.
		w.dequeued()
		b.leave(queue.Leaver{Entry: w.entry, Room: pr.Room, Slot: pr.Slot, Costs: w.costs})
		return true, false, b.tooLong(pr.Delay, own)
	case pr.Found:
		w.dequeued()
		if pr.Claimed || pr.Swapped {
			b.sawOthers()
		}
		if pr.Claimed {
			b.notices.poke() // there may be more to take
		}
		w.rep.Slot = time.UnixMicro(pr.Slot)
		w.rep.countPoll(pr)
		again, err = b.sleepToSlot(ctx, sent, received, pr.Delay, w.rep, w.costs, w.entry, pr.Room)
		return true, again, err
	case pr.Stale:
		// The poll itself came too late for the slot: keep the place.
		w.dequeued()
		if pr.Swapped || pr.Room == "" {
			b.sawOthers() // another handle's caller took it, or gave its own
		}
		w.rep.Slot = time.UnixMicro(pr.Slot)
		again, err = b.retime(ctx, w.rep, w.costs, w.entry, pr.Room)
		return true, again, err
	case pr.Lost:
		return true, true, nil
	case own > 0 && pr.Delay > own:
		// Still queued, and its turn now estimated past its deadline
		// (callers ahead took longer, or late ones took slots first).
		b.cancel(w.entry)
		return true, false, b.tooLong(pr.Delay, own)
	}
	w.rep.Position = pr.Position
	if pr.LockTTL < 0 {
		b.sched.Ensure()
	}
	b.nextPoll(w, pr)
	return false, false, nil
}

// nextPoll sets when a caller still queued polls next, by its poll's
// reply pr.
func (b *Bucket) nextPoll(w *waiting, pr queueio.PollReply) {
	w.wait = pr.Delay - b.leadNow()
	if pr.Told && w.wait > 0 {
		// Its slot is not its entry's estimate (later: callers ahead
		// were late and took the next slots first; earlier: some left):
		// the step tells it on the wake channel (notices) when it gives
		// that slot. It waits for the message, polling only to check in,
		// rather than at each new estimate (under overload late callers
		// ahead push it back again and again).
		w.wait = max(w.wait, checkIn)
		return
	}
	// Far from its slot (callers ahead cancelled, or the caller woke
	// early): trust the new estimate. At or past it: the scheduler is
	// late or dead; back off, but never beyond the moment its lock
	// expires, when this caller may take over.
	if w.wait < w.backoff {
		w.wait = w.backoff
		if pr.LockTTL > 0 {
			w.wait = min(w.wait, pr.LockTTL+time.Millisecond)
		}
		w.backoff = min(2*w.backoff, b.cfg.LockTTL/4)
	}
}

// leadNow is how long before its slot a caller polls: a quarter of the
// lookahead, or twice the round trip the client's calls take now when
// that is longer (thousands of callers polling at once), but at most half
// the lookahead, by when the scheduler has surely given the slot. A poll
// whose reply came after the slot leaves the caller late. A process that
// stops polls closer (below).
func (b *Bucket) leadNow() time.Duration {
	lead := min(max(b.lead, 2*b.hub.RoundTrip()), b.cfg.Lookahead/2)
	if b.hub.Stopped() && b.othersLately() {
		// A process that stops (a pod at its CPU limit) polls as close
		// to its slot as the network allows: a slot collected ahead and
		// then missed, its process stopped in between, holds its tokens
		// for a caller that does not run; one not yet collected is
		// claimed by a running caller of another process (claim.lua).
		lead = min(lead, max(stoppedLead, 2*b.rtt.min()))
	}
	return lead
}

// stoppedLead is the lead of a process that stops: enough for a step's
// slot to be written and its poll's reply to come back.
const stoppedLead = time.Millisecond

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
