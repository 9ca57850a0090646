package local

import (
	"context"
	"sync"
	"time"
)

// schedule decides when the next start may happen. The queue calls it with
// its lock held and guarantees that at most one booking made by book is still
// in the future at any time (the front waiter's), so unbook always undoes the
// most recent booking and can restore the state exactly.
type schedule interface {
	// book commits the next start, of cost n >= 1, at or after now, and
	// returns its time.
	book(now time.Time, n int) time.Time
	// unbook gives back the most recent booking, which has not started
	// yet, whole.
	unbook(now time.Time)
	// estimate returns the time a booking would get if bookings of total
	// cost k >= 1 were made now, itself the last of them, booking nothing.
	estimate(now time.Time, k int) time.Time
}

// waiter states, changed only with queue.mu held.
const (
	queued  = iota // in the queue, behind the front
	front          // at the front, holding a booking at waiter.at
	granted        // left the queue: its turn has come
)

// waiter is one caller waiting in a queue.
type waiter struct {
	prev, next *waiter
	state      int
	cost       int           // tokens it takes, >= 1
	at         time.Time     // the booking, when state is front; guarded by queue.mu
	ready      chan struct{} // receives once when a queued waiter moves up
}

// queue is a FIFO of callers in front of a schedule. Only the front waiter
// holds a booking and sleeps on a timer; the others wait for their
// predecessor to hand the front over, whatever their costs: a large cost at
// the front holds back the cheap ones behind it, so no caller overtakes
// another. A waiter that gives up just leaves the list, and if it was the
// front its booking (its whole cost) is undone before the next one books, so
// cancellation never leaves a hole in the schedule.
//
// The zero value is not usable: sched must be set.
type queue struct {
	sched    schedule
	maxQueue int           // 0: unbounded
	maxWait  time.Duration // 0: unbounded
	tally    tally         // the calls, for Stats and the Observer

	mu          sync.Mutex
	first, last *waiter
	n           int // waiters in the list
	pending     int // the summed cost of the waiters behind the front (not booked yet)
}

// enter returns when the caller, of cost n >= 1, may start, when it is
// refused, or when ctx ends, and reports the call to the tally.
func (q *queue) enter(ctx context.Context, n int) error {
	start := q.tally.begin()
	slot, err := q.wait(ctx, n)
	// A slot means the caller was not let through on arrival.
	q.tally.end(ctx, start, err, !slot.IsZero(), slot)
	return err
}

// wait is enter's wait. slot is the start the caller was booked for when
// it did not start on arrival (zero when it did, or never queued).
func (q *queue) wait(ctx context.Context, n int) (slot time.Time, _ error) {
	if err := ctx.Err(); err != nil {
		return slot, err
	}
	q.mu.Lock()
	now := time.Now()
	if q.maxQueue > 0 && q.n >= q.maxQueue {
		q.mu.Unlock()
		return slot, errQueueFull
	}
	// The front's booking is already in the schedule; the others' costs
	// and the caller's own are not.
	if q.maxWait > 0 && q.sched.estimate(now, q.pending+n).Sub(now) > q.maxWait {
		q.mu.Unlock()
		return slot, errWaitTooLong
	}
	if q.n == 0 {
		at := q.sched.book(now, n)
		if !at.After(now) {
			q.mu.Unlock()
			return slot, nil
		}
		w := &waiter{state: front, cost: n, at: at}
		q.push(w)
		q.mu.Unlock()
		return q.sleep(ctx, w)
	}
	w := &waiter{state: queued, cost: n, ready: make(chan struct{}, 1), at: now}
	q.push(w)
	q.mu.Unlock()

	select {
	case <-w.ready:
	case <-ctx.Done():
		return q.abandon(ctx, w)
	}
	// The send on ready orders the promoter's writes to w before this read,
	// and from here on only this goroutine changes w's state (retime may
	// move w.at, under q.mu).
	if w.state == granted {
		return w.at, nil
	}
	return q.sleep(ctx, w)
}

// sleep waits until the front waiter's booking comes due. The booking may
// move later while it sleeps (retime): when the timer fires early, it
// sleeps again until the new time. It returns the booking.
func (q *queue) sleep(ctx context.Context, w *waiter) (time.Time, error) {
	q.mu.Lock()
	t := time.NewTimer(time.Until(w.at))
	q.mu.Unlock()
	defer t.Stop()
	for {
		select {
		case <-t.C:
			q.mu.Lock()
			now := time.Now()
			if w.at.After(now) {
				t.Reset(w.at.Sub(now))
				q.mu.Unlock()
				continue
			}
			q.remove(w)
			q.promote(now)
			q.mu.Unlock()
			return w.at, nil
		case <-ctx.Done():
			return q.abandon(ctx, w)
		}
	}
}

// retime runs change on the schedule as if the front waiter had not
// booked yet, then books the front again: its new time is never earlier
// when change only takes tokens or delays starts, and its sleep picks the
// new time up when its timer fires. A front whose booking is already due
// keeps it (it is as good as granted). The waiters behind the front book
// when they reach it, so they follow in order.
func (q *queue) retime(change func(now time.Time)) {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := time.Now()
	w := q.first
	if w == nil || w.state != front || !w.at.After(now) {
		change(now)
		return
	}
	q.sched.unbook(now)
	change(now)
	w.at = q.sched.book(now, w.cost)
}

// abandon handles a waiter whose ctx ended. A waiter whose turn came before
// the cancellation was handled is let through (its slot would otherwise be
// lost); any other leaves the queue and gives back its booking. It returns
// the waiter's booking, or the time it arrived when it had none.
func (q *queue) abandon(ctx context.Context, w *waiter) (time.Time, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := time.Now()
	switch w.state {
	case granted:
		return w.at, nil
	case front:
		q.remove(w)
		if !w.at.After(now) {
			q.promote(now)
			return w.at, nil
		}
		q.sched.unbook(now)
		q.promote(now)
	default:
		q.remove(w)
		q.pending -= w.cost
	}
	return w.at, ctx.Err()
}

// promote books for the waiters at the front of the queue, letting through
// those whose booking is due now, until one has to sleep. q.mu must be held
// and the queue must have no front waiter.
func (q *queue) promote(now time.Time) {
	for w := q.first; w != nil; w = q.first {
		q.pending -= w.cost
		at := q.sched.book(now, w.cost)
		if at.After(now) {
			w.state, w.at = front, at
			w.ready <- struct{}{}
			return
		}
		q.remove(w)
		w.state, w.at = granted, at
		w.ready <- struct{}{}
	}
}

func (q *queue) push(w *waiter) {
	w.prev = q.last
	if q.last != nil {
		q.last.next = w
	} else {
		q.first = w
	}
	q.last = w
	q.n++
	if w.state == queued {
		q.pending += w.cost
	}
}

func (q *queue) remove(w *waiter) {
	if w.prev != nil {
		w.prev.next = w.next
	} else {
		q.first = w.next
	}
	if w.next != nil {
		w.next.prev = w.prev
	} else {
		q.last = w.prev
	}
	w.prev, w.next = nil, nil
	q.n--
}

// waiting returns the number of callers in the queue.
func (q *queue) waiting() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}
