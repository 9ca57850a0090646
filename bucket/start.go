// The start: the final sleep to the slot, the caller's lateness, and the
// retimes of a caller too late for its slot.

package bucket

import (
	"context"
	"errors"
	"time"

	"github.com/sluicehq/sluice/internal/hub"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/internal/rediscall"
	"github.com/sluicehq/sluice/queue"
)

// sleepToSlot sleeps until the slot, then checks that the caller is not so
// late that its start would bunch with later ones. The reply said "delay
// from Redis's now", and Redis's now lies between sent and received: the
// caller sleeps until received+delay, never before the slot, and judges its
// lateness from sent+delay, less the round trip the network always takes,
// so that a reply that sat unread (a starved or frozen process) counts too.
// A caller later than MaxLateness keeps its place (retime): costs and room
// are what that needs. A caller whose ctx ends before its slot, or whose
// new slot comes after its deadline, leaves (entry: its queue entry, ""
// for one given its slot at arrival) and passes its slot on.
func (b *Bucket) sleepToSlot(ctx context.Context, sent, received time.Time, delay time.Duration, rep *entered, costs []int64, entry, room string) (bool, error) {
	for {
		late, err := b.sleepLate(ctx, sent, received, delay, rep)
		if err != nil {
			if room != "" && !errors.Is(err, errClosed) {
				b.leave(queue.Leaver{Entry: entry, Room: room, Slot: rep.Slot.UnixMicro(), Costs: costs})
			}
			return false, err
		}
		if !late {
			return false, nil
		}
		var r queueio.Retimed
		if sent, received, r, err = b.retimeOnce(ctx, rep, costs, room); err != nil {
			return b.retimeFailed(ctx, err)
		}
		if r.Entry != "" {
			return false, writtenSlot{r, received}
		}
		delay, room = r.Delay, r.Room
		if own := b.ownWait(ctx); own > 0 && delay > own {
			b.leave(queue.Leaver{Entry: entry, Room: room, Slot: rep.Slot.UnixMicro(), Costs: costs})
			return false, b.tooLong(delay, own)
		}
	}
}

// retime gives a caller too late for its slot the next one (retimeOnce),
// then sleeps to it as sleepToSlot does.
func (b *Bucket) retime(ctx context.Context, rep *entered, costs []int64, entry, room string) (bool, error) {
	sent, received, r, err := b.retimeOnce(ctx, rep, costs, room)
	if err != nil {
		return b.retimeFailed(ctx, err)
	}
	if r.Entry != "" {
		return false, writtenSlot{r, received}
	}
	if own := b.ownWait(ctx); own > 0 && r.Delay > own {
		b.leave(queue.Leaver{Entry: entry, Room: r.Room, Slot: r.Slot, Costs: costs})
		return false, b.tooLong(r.Delay, own)
	}
	return b.sleepToSlot(ctx, sent, received, r.Delay, rep, costs, entry, r.Room)
}

// retimeOnce asks Redis for the next slot of a caller too late for its own
// (queue.Retime): it keeps its place ahead of the callers queued, and the
// missed slot's tokens go back to the bucket when that is exact. A late
// caller thus throws nothing away and adds no arrival, so that a starved
// host cannot feed its own overload (docs/design.md, "Overload").
//
// Its call to Redis is bounded as enterOnce's are: when it runs out of its
// limit while Redis answers a PING (slow, not away), it is made again with
// twice the limit; a slot the lost reply held is then spent, never
// granted twice.
func (b *Bucket) retimeOnce(ctx context.Context, rep *entered, costs []int64, room string) (sent, received time.Time, r queueio.Retimed, err error) {
	for limit := b.answerWithin(); ; limit = min(2*limit, time.Minute) {
		cctx, done, within := rediscall.CallCtx(ctx, limit)
		sentFn, rctx := sentAt(cctx, b.now)
		r, err = b.q.Retime(rctx, rep.Slot.UnixMicro(), room, costs, b.newID(), b.rtt.min() <= quietTrip)
		done()
		received = b.now()
		rep.RoundTrips++
		if err != nil && b.busy(ctx, cctx, within, err) {
			continue
		}
		if err != nil && b.fb.away(ctx, err) {
			return sent, received, r, goneLocal{} // the missed slot stays spent
		}
		if err != nil {
			if !errors.As(err, new(*queueio.ConfigError)) && !errors.Is(err, queue.ErrNotReplicated) {
				err = b.callErr(ctx, err, within) // retimeFailed reads the others
			}
			return sent, received, r, err
		}
		sent = sentFn() // only now: a failed call may still be stamping it
		break
	}
	b.rtt.observe(received.Sub(sent))
	b.hub.Replied(sent)
	rep.Retimes++
	if r.Claimed || r.Entry != "" {
		b.sawOthers()
	}
	b.drain()
	if r.Refunded {
		rep.Refunds++
	}
	if r.Claimed {
		rep.Claims++
	}
	rep.Slot = time.UnixMicro(r.Slot)
	return sent, received, r, nil
}

// quietTrip is the longest recent round trip (Bucket.rtt) at which a late
// caller's grant may move to now whenever the bucket counted no refill
// since its slot (queue.Retime's quiet), not only when the peaks allow:
// such a grant sits close to the next refill's, and the caller starts it
// as late as its reply comes, which sleepLate judges less the round trip
// the handle takes as the network's. A handle of a starved process (the
// bench's tenants, 2,000 buckets of capacity 1 at 5/s on one client,
// beside busy loops) sees every reply late, and takes 80 ms for the
// network: its moved callers started up to 57 ms after their grants,
// three starts of a bucket within 171 ms, one more than the start times'
// windows allow (3 of 3 runs beside two busy loops, 1 of 6 beside one;
// 0 of 6 with this bound). Up to 4 ms, the reply's one-way trip stays
// within the 2 ms those windows allow beyond MaxLateness.
const quietTrip = 4 * time.Millisecond

// writtenSlot is what sleepToSlot and retime return for a late caller
// whose next slot Retime wrote rather than told (r, its reply received
// then): enterOnce then has it poll for that slot (awaitWritten), as a
// queued caller does, in its own loop rather than deeper in this one.
type writtenSlot struct {
	r        queueio.Retimed
	received time.Time
}

func (writtenSlot) Error() string {
	return "bucket: a late caller's next slot was written; poll for it"
}

// awaitWritten polls for its slot, as a queued caller does (awaitSlot),
// a late caller whose next slot Retime wrote rather than told.
func (b *Bucket) awaitWritten(ctx context.Context, ws writtenSlot, rep *entered, costs []int64, limit *time.Duration) (bool, error) {
	r := ws.r
	if own := b.ownWait(ctx); own > 0 && r.Delay > own {
		b.cancel(r.Entry)
		return false, b.tooLong(r.Delay, own)
	}
	b.queued.Add(1) // awaitSlot's dequeued takes it off
	er := queueio.Arrival{Entry: r.Entry, Delay: r.Delay, Position: 1, SchedulerRunning: true, Ticket: rep.Ticket, Now: r.Now}
	return b.awaitSlot(ctx, er, ws.received, rep, costs, limit)
}

// retimeFailed: a Retime that failed leaves the missed slot's tokens spent;
// the caller enters again, unless its ctx ended or Redis failed it.
func (b *Bucket) retimeFailed(ctx context.Context, err error) (bool, error) {
	if errors.As(err, new(goneLocal)) {
		return false, err // enter admits it from the local share
	}
	if ctx.Err() != nil || errors.Is(err, queue.ErrNotReplicated) {
		return false, b.redisErr(ctx, err)
	}
	var cerr *queueio.ConfigError
	if errors.As(err, &cerr) {
		return true, nil // a live change: enter again under the policies in force
	}
	return false, b.redisErr(ctx, err)
}

// sleepLate sleeps until the slot and reports whether the caller is later
// than MaxLateness.
func (b *Bucket) sleepLate(ctx context.Context, sent, received time.Time, delay time.Duration, rep *entered) (bool, error) {
	rep.Margin = sent.Add(delay).Sub(received)
	if err := b.hub.Sleep(ctx, received.Add(delay).Sub(b.now()), b.bg.Done()); err != nil {
		if errors.Is(err, hub.ErrStopped) {
			err = errClosed
		}
		return false, err // sleepToSlot passes the slot on
	}
	rep.Late = max(0, b.now().Sub(sent.Add(delay))-b.rtt.min())
	if b.cfg.MaxLateness >= 0 && rep.Late > b.cfg.MaxLateness {
		return true, nil
	}
	return false, nil
}

// countPoll counts a poll that found a slot taken from another caller
// (Claimed) or given for its own, which another caller took because this
// one had not come for it (Swapped: a retime, as for a caller later than
// MaxLateness; see queueio.PollReply).
func (rep *entered) countPoll(pr queueio.PollReply) {
	if pr.Claimed {
		rep.Claims++
	}
	if pr.Swapped {
		rep.Retimes++
	}
}

// sawOthers notes a reply that showed callers of other handles waiting in
// this bucket (Bucket.others), and has this process's stops watched.
func (b *Bucket) sawOthers() {
	b.others.Store(b.now().UnixNano())
	if b.watching.CompareAndSwap(false, true) {
		b.hub.WatchStops(b.onTick)
	}
}

// othersLately says whether a reply showed callers of other handles in
// the last second.
func (b *Bucket) othersLately() bool {
	return b.now().UnixNano()-b.others.Load() < int64(time.Second)
}

// onTick is this bucket's turn at a tick of the process's stop watch
// (hub.WatchStops), while it has callers queued and has lately seen
// other handles' callers: while the process runs again after a stop (a
// pod at its CPU limit), its earliest queued
// caller polls now, to take a slot or tokens that another process's
// caller, stopped too, left; each that takes one has the next poll
// (afterPoll). A pod runs a few ms of every 100: the tokens due
// meanwhile go to whoever runs, as with a limiter that takes a token
// when its caller runs, rather than sit held for callers that do not.
// Each queued caller polls at most once for the ticks (pokeFresh): a
// poll that finds nothing is a round trip for nothing, and poking the
// earliest caller at every tick had one caller of a process on a busy
// host (its ticks 10 ms late now and then) poll 21 times for one slot
// (bucket/TestPushLaneSaturated, clean-clone CI).
func (b *Bucket) onTick(since time.Duration) bool {
	select {
	case <-b.bg.Done():
		return false // closed: no more watching
	default:
	}
	if b.queued.Load() == 0 || !b.othersLately() {
		b.watching.Store(false)
		return false
	}
	if since < hub.StoppedLately {
		b.notices.pokeFresh()
	}
	return true
}

// drain has a queued caller of this process poll at once, to take a slot
// another process's caller did not come for, or tokens nobody came for
// (claim.lua), when this process has just found itself late (a late
// caller, a pod at its CPU limit: the others were likely stopped too)
// and other handles' callers were seen in the last second. Each caller
// that takes one has the next poll (afterPoll), until none is left.
func (b *Bucket) drain() {
	if b.othersLately() {
		b.notices.poke()
	}
}
