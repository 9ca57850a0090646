package bucket

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/queue"
)

// arrivals batches the enqueues of a Bucket's concurrent callers: a caller
// that finds no enqueue in flight sends its own at once, on its own ctx (so
// an uncontended Enter costs one round trip and nothing more); callers that
// arrive meanwhile wait for it to return and then go to Redis together, in
// their order of arrival here, in one script call. One round trip then
// serves hundreds of callers, which is what lets a process admit 100
// concurrent callers in well under a millisecond.
type arrivals struct {
	q       *queue.Queue
	max     int           // most callers in one script call
	timeout time.Duration // bound on one batched call
	ctx     context.Context
	now     func() time.Time
	leave   func(entry string) // cancels a caller that left during its enqueue
	// push says whether arrivals go by the push lane (queue.PushBatch):
	// while others wait, no decision of enqueue.lua's is left to make.
	push func() bool
	wg   sync.WaitGroup // the flusher goroutine

	mu      sync.Mutex
	busy    bool // an enqueue is in flight (inline or the flusher's)
	closed  bool // no flusher may start
	pending []*arrival
}

type arrival struct {
	id    string
	done  chan struct{} // closed when reply/err are set
	sent  time.Time     // when its batch left for Redis
	reply queue.EnqueueReply
	err   error
	taken bool // taken into a batch (under mu)
	gone  bool // its caller left before the reply (under mu)
}

// enqueue makes caller id arrive, alone or in a batch. It also returns when
// the call carrying it left for Redis.
func (a *arrivals) enqueue(ctx context.Context, id string) (queue.EnqueueReply, time.Time, error) {
	a.mu.Lock()
	if !a.busy {
		a.busy = true
		a.mu.Unlock()
		sent := a.now()
		rs, err := a.send(ctx, []string{id})
		a.mu.Lock()
		a.handOff()
		a.mu.Unlock()
		if err != nil {
			return queue.EnqueueReply{}, sent, err
		}
		return rs[0], sent, nil
	}
	ar := &arrival{id: id, done: make(chan struct{})}
	a.pending = append(a.pending, ar)
	a.mu.Unlock()
	select {
	case <-ar.done:
		return ar.reply, ar.sent, ar.err
	case <-ctx.Done():
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	select {
	case <-ar.done:
		return ar.reply, ar.sent, ar.err
	default:
	}
	if ar.taken {
		ar.gone = true // the flusher takes it out of the queue again
	} else {
		a.pending = slices.DeleteFunc(a.pending, func(x *arrival) bool { return x == ar })
	}
	return queue.EnqueueReply{}, time.Time{}, ctx.Err()
}

// handOff, under mu, passes the callers who gathered during an enqueue to
// the flusher, or marks the way free. After close it sends them away.
func (a *arrivals) handOff() {
	if a.closed {
		for _, ar := range a.pending {
			ar.err = context.Canceled // the caller reports ErrClosed
			close(ar.done)
		}
		a.pending = nil
	}
	if len(a.pending) == 0 {
		a.busy = false
		return
	}
	a.wg.Add(1)
	go a.flush()
}

// close stops the flusher (cancelling its call) and waits for it. No
// flusher starts afterwards: the flag is set under mu, where handOff
// decides.
func (a *arrivals) close(cancel context.CancelFunc) {
	a.mu.Lock()
	a.closed = true
	a.mu.Unlock()
	cancel()
	a.wg.Wait()
}

// flush sends the gathered callers in batches until none is left. It is
// owned by the Bucket: Close cancels a.ctx and waits for it.
func (a *arrivals) flush() {
	defer a.wg.Done()
	for {
		a.mu.Lock()
		n := min(len(a.pending), a.max)
		if n == 0 {
			a.busy = false
			a.mu.Unlock()
			return
		}
		batch := slices.Clone(a.pending[:n])
		a.pending = slices.Clone(a.pending[n:])
		ids := make([]string, n)
		for i, ar := range batch {
			ar.taken = true
			ids[i] = ar.id
		}
		a.mu.Unlock()

		sent := a.now()
		ctx, cancel := context.WithTimeout(a.ctx, a.timeout)
		replies, err := a.send(ctx, ids)
		cancel()

		var abandoned []string
		a.mu.Lock()
		for i, ar := range batch {
			ar.sent = sent
			if err != nil {
				ar.err = err
			} else {
				ar.reply = replies[i]
				if ar.gone && replies[i].Kind == queue.Queued {
					abandoned = append(abandoned, replies[i].Entry)
				}
			}
			close(ar.done)
		}
		a.mu.Unlock()
		for _, entry := range abandoned {
			a.leave(entry)
		}
	}
}

// send makes ids arrive in one round trip: by the push lane when push
// says so and the server takes it, else by enqueue.lua.
func (a *arrivals) send(ctx context.Context, ids []string) ([]queue.EnqueueReply, error) {
	if a.push != nil && a.push() {
		rs, err := a.q.PushBatch(ctx, ids)
		if !errors.Is(err, queue.ErrNoPush) {
			return rs, err
		}
	}
	return a.q.EnqueueBatch(ctx, ids)
}

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
