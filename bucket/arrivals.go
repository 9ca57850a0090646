package bucket

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/background"
	"github.com/sluicehq/sluice/internal/hub"
	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/queue"
)

// The comings and goings of a Bucket's callers go to Redis in batches
// (background.Batcher): a caller that finds nothing in flight sends its
// arrival at once, on its own ctx (so an uncontended Enter costs one round
// trip and nothing more); callers that arrive meanwhile wait for it to
// return and then go to Redis together, in their order of arrival here, in
// one call. One round trip then serves hundreds of callers, which is what
// lets a process admit 100 concurrent callers in well under a millisecond.
//
// Callers who give up leave the queue the same way, in the background: a
// caller whose ctx ended returns at once, whatever Redis is doing, and a
// storm of 1000 cancellations costs a few round trips, not 1000. Until a
// cancel lands the scheduler may still give that caller a slot: the cancel
// then passes the slot to the next caller in line (queue.Cancel), as it does for a caller that
// leaves after its poll read its slot.

// maxBatch is the most callers in one arrival or cancel call.
const maxBatch = 512

// arrival is one caller's trip to Redis through the arrivals batcher.
type arrival struct {
	id    string
	costs []int64       // per policy; nil: each policy's Call
	wait  time.Duration // the longest it may wait (its ctx's deadline); 0: none of its own
	done  chan struct{} // closed when reply/err are set
	sent  time.Time     // when its batch left for Redis
	reply queueio.Arrival
	err   error
	gone  bool // its caller left before the reply (under Bucket.handoff)
}

// comings holds a Bucket's two batchers.
type comings struct {
	q       *queue.Queue
	now     func() time.Time
	arr     *background.Batcher[*arrival]
	left    *background.Batcher[*queue.Leaver]
	handoff sync.Mutex // between a batch's replies and callers who give up
	// learn hears every arrival's reply (of a call that left at sent), of
	// the bucket's own costs in the default lane, before the call counts as returned (the
	// batcher busy no more): a caller that finds no call in flight finds
	// what the last one learned (Bucket.learnBack).
	learn func(sent time.Time, r queueio.Arrival)
}

// init makes the batchers: arrivals sent by the batcher are bounded by
// arriveTimeout, cancels by leaveTimeout.
func (c *comings) init(g *background.Group, q *queue.Queue, arriveTimeout, leaveTimeout time.Duration, now func() time.Time) {
	c.q, c.now = q, now
	c.arr = background.NewBatcher(g, background.BatcherConfig[*arrival]{Send: c.sendArrivals, Max: maxBatch, Timeout: arriveTimeout})
	// Cancels drain on Close: each one left unsent wastes a token.
	c.left = background.NewBatcher(g, background.BatcherConfig[*queue.Leaver]{
		Send: func(ctx context.Context, ls []*queue.Leaver) {
			all := make([]queue.Leaver, len(ls))
			for i, l := range ls {
				all[i] = *l
			}
			_ = q.Cancel(ctx, all...)
		},
		Max:     maxBatch,
		Timeout: leaveTimeout,
		Drain:   true,
	})
}

// enqueue makes caller id, of costs (nil: each policy's Call), that may
// wait at most wait (0: no bound of its own) arrive, alone or in a batch.
// It also returns when the call carrying it left for Redis.
func (c *comings) enqueue(ctx context.Context, id string, costs []int64, wait time.Duration) (queueio.Arrival, time.Time, error) {
	if c.arr.Claim() {
		sentFn, left := c.sentAt(ctx)
		var cs [][]int64
		if costs != nil {
			cs = [][]int64{costs}
		}
		var ws []time.Duration
		if wait > 0 {
			ws = []time.Duration{wait}
		}
		rs, err := c.q.Enqueue(left, []string{id}, cs, ws)
		if err != nil {
			c.arr.Release()
			// Not sentFn: a shared pipeline the call left early (its ctx
			// ended) may still be stamping it.
			return queueio.Arrival{}, time.Time{}, err
		}
		sent := sentFn()
		if costs == nil && protocol.IDLane(id) == "" {
			c.learn(sent, rs[0])
		}
		c.arr.Release()
		return rs[0], sent, nil
	}
	ar := &arrival{id: id, costs: costs, wait: wait, done: make(chan struct{})}
	c.arr.Add(ar)
	select {
	case <-ar.done:
		return ar.reply, ar.sent, ar.err
	case <-ctx.Done():
	}
	if c.arr.Withdraw(ar) {
		return queueio.Arrival{}, time.Time{}, ctx.Err()
	}
	c.handoff.Lock()
	defer c.handoff.Unlock()
	select {
	case <-ar.done:
		return ar.reply, ar.sent, ar.err
	default:
	}
	ar.gone = true // its batch takes it out of the queue again
	return queueio.Arrival{}, time.Time{}, ctx.Err()
}

// sendArrivals is the arrivals batcher's send.
func (c *comings) sendArrivals(ctx context.Context, batch []*arrival) {
	ids := make([]string, len(batch))
	var costs [][]int64
	var waits []time.Duration
	for i, ar := range batch {
		ids[i] = ar.id
		if ar.costs != nil && costs == nil {
			costs = make([][]int64, len(batch))
		}
		if ar.wait > 0 && waits == nil {
			waits = make([]time.Duration, len(batch))
		}
	}
	for i, ar := range batch {
		if costs != nil {
			costs[i] = ar.costs
		}
		if waits != nil {
			waits[i] = ar.wait
		}
	}
	sentFn, left := c.sentAt(ctx)
	before := c.now()
	replies, err := c.q.Enqueue(left, ids, costs, waits)
	sent := before // a call that failed may still be stamped later by the pipeline it was handed to (hub.SentAt)
	if err == nil {
		sent = sentFn()
	}
	var abandoned []string
	c.handoff.Lock()
	for i, ar := range batch {
		ar.sent = sent
		if err != nil {
			ar.err = err
		} else {
			ar.reply = replies[i]
			if ar.costs == nil && protocol.IDLane(ar.id) == "" {
				c.learn(sent, replies[i])
			}
			if ar.gone && replies[i].Entry != "" {
				abandoned = append(abandoned, replies[i].Entry)
			}
		}
		close(ar.done)
	}
	c.handoff.Unlock()
	for _, entry := range abandoned {
		c.leave(queue.Leaver{Entry: entry})
	}
}

// sentAt returns ctx for a call to Redis and a function that tells, once
// the call returned, when it left for Redis on the local clock: not before
// it was made, later when it waited in the client's shared pipelining
// (hub.SentAt). A caller judges its lateness from it.
func (c *comings) sentAt(ctx context.Context) (func() time.Time, context.Context) {
	return sentAt(ctx, c.now)
}

// sentAt is comings.sentAt for any call, on the local clock now.
func sentAt(ctx context.Context, now func() time.Time) (func() time.Time, context.Context) {
	asked, real := now(), time.Now()
	var at time.Time
	return func() time.Time {
		if at.After(real) {
			return asked.Add(at.Sub(real))
		}
		return asked
	}, hub.SentAt(ctx, &at)
}

// leave takes a caller that gave up out of the queue, by its entry or, if
// it never learned it, by its ID, in the background; with the room of the
// slot its poll read, if any, so that its tokens pass on.
func (c *comings) leave(l queue.Leaver) { c.left.Add(&l) }

// roundTrip tracks the shortest recent round trip to Redis: what a reply
// costs when nothing is wrong. It follows a slower network up slowly
// (1/64 of the difference per call) and a faster one down at once.
type roundTrip struct{ ns atomic.Int64 }

func (r *roundTrip) observe(d time.Duration) {
	if d <= 0 {
		return
	}
	for {
		cur := r.ns.Load()
		next := int64(d)
		if cur > 0 && int64(d) > cur {
			next = cur + (int64(d)-cur)/64
		}
		if r.ns.CompareAndSwap(cur, next) {
			return
		}
	}
}

func (r *roundTrip) min() time.Duration { return time.Duration(r.ns.Load()) }
