package semaphore

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/verdict"
)

// The caller's path: Acquire, AcquireN and Do, from the arrival to the
// grant or the place given up.

// Acquire waits for a permit of weight 1 and returns it; it is
// AcquireN(ctx, 1). The caller must Release it. While held, the permit's
// lease is renewed in the background; if it is lost anyway, Permit.Lost is
// closed.
//
// Acquire returns an error matching ctx.Err() when ctx ends first, and then
// gives its place in the queue up; while Redis is unreachable that error
// also matches, and names, Redis's last error ("connection refused"). It
// returns sluice.ErrQueueFull when Config.MaxQueue callers already wait
// in its lane, an error matching sluice.ErrConfig, before anything is
// queued, when ctx names a bad lane (WithLane),
// sluice.ErrClosed after Close, sluice.ErrConfigMismatch when Config.Capacity differs
// from the capacity in force (see Config.Adopt), and an error wrapping
// Redis's when its arrival cannot be recorded.
//
// While Redis is unreachable (it refuses connections, or does not answer)
// Acquire fails, whatever its ctx, within min(Config.LeaseTTL,
// Config.QueueTTL) (2 s by default; at least 150 ms), or at its ctx's
// deadline if that comes first: this process's exchanges with Redis, one
// every third of that time while callers wait, each give up after two
// thirds of it, and a waiter fails with the first exchange that fails
// (its place in Redis could not be kept anyway). The error says so in a
// person's words ("semaphore \"api\": Redis at 127.0.0.1:6379
// unreachable: connection refused (no answer within 1.3s)") and matches
// the network's error (syscall.ECONNREFUSED); it matches ctx.Err() only
// when ctx ended first.
//
// With Config.Fallback set to LocalShare, Acquire does not fail because
// Redis is unreachable: within the probe's bound (a refused connection at
// once, no answer for 200 ms) it waits for, and is granted
// from, this process's local share instead (see LocalShare). It still
// fails so in a process that has not reached Redis since it started (the
// error says there is no local share), when its weight is above the local
// share (it could not be granted before Redis answers again), and when
// Redis answers with an error (READONLY, OOM), which is never a reason to
// switch.
func (s *Semaphore) Acquire(ctx context.Context) (*Permit, error) {
	return s.AcquireN(ctx, 1)
}

// AcquireN waits for a permit of weight n, worth n of Config.Capacity, and
// returns it, as Acquire does for weight 1; Release gives the whole weight
// back. The weights held never sum above Capacity.
//
// Waiters are served in arrival order whatever their weights: a waiter at
// the head of the queue waits until its n are free, and those behind it
// wait too, even a lighter one that would fit (no overtaking, so a heavy
// waiter is never starved). With lanes (WithLane) the waiter served next
// is the head of the lane chosen by weight and priority, and it is
// likewise not overtaken while it waits for its n. Giving up (ctx ends)
// frees its place and those behind move up. MaxQueue counts waiters, not
// weights.
//
// A weight above the capacity could never be granted: AcquireN refuses it
// with an error matching sluice.ErrCostExceedsCapacity, at once and without
// talking to Redis when it is above the capacity this process last heard
// of (Config.Capacity before its first call), else when Redis answers. A
// waiter whose weight is above a capacity lowered by SetCapacity while it
// waits gets that error too, when it next hears from Redis. A weight below
// 1 is an error (a bug in the caller, which the Observer is not told of).
func (s *Semaphore) AcquireN(ctx context.Context, n int) (p *Permit, err error) {
	if n < 1 {
		return nil, fmt.Errorf("semaphore: weight %d, want at least 1", n)
	}
	var start time.Time
	if s.cfg.Observer != nil {
		start = time.Now()
	}
	s.tally.Begin()
	var queued, local bool
	defer func() {
		res, why := verdict.Classify(ctx, err, reasons...)
		e := sluice.Event{Result: res, Reason: why, Queued: queued, Local: local}
		if !start.IsZero() {
			e.Wait = time.Since(start)
		}
		s.tally.End(e)
	}()
	p, queued, local, err = s.acquire(ctx, n)
	return p, err
}

// reasons are the semaphore's errors as Events name them; the shared ones
// (sluice.ErrCostExceedsCapacity, sluice.ErrConfigMismatch, a ctx's) are
// verdict.Classify's.
var reasons = []verdict.Reason{
	{Err: errQueueFull, Result: sluice.Refused, Name: "queue_full"},
	{Err: errClosed, Result: sluice.Failed, Name: "closed"},
	// State written by a newer version: the deployment disagrees with
	// itself, as with a Capacity of its own.
	{Err: errUnknownFormat, Result: sluice.Failed, Name: "config_mismatch"},
}

// acquire is AcquireN for a valid weight n; queued reports that the
// caller waited in the queue in Redis (it was not granted on arrival),
// local that it was served, or failed, by the local share
// (Config.Fallback).
func (s *Semaphore) acquire(ctx context.Context, n int) (_ *Permit, queued, local bool, _ error) {
	lane, err := s.laneOf(ctx)
	if err != nil {
		return nil, false, false, err // nothing queued
	}
	if err := s.checkArrival(ctx, n); err != nil {
		return nil, false, false, err
	}
	seq := s.nextID.Add(1)
	w := &waiter{id: s.idOf(seq, n, lane), weight: n, lane: lane, seq: seq, ch: make(chan struct{})}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, false, false, errClosed
	}
	s.waiters[w.id] = w
	s.listenLocked()
	if s.mode != onRedis {
		// Redis is away, or this process has just registered its permits
		// there and waits for the others to (fallback.go).
		s.queueLocalLocked(w)
		s.mu.Unlock()
		s.kick()
		return s.await(ctx, w)
	}
	direct, releases := s.directLocked(w)
	s.mu.Unlock()
	s.sendTrace()
	if direct {
		s.sendDirect(ctx, w, releases)
	} else {
		s.kick()
	}
	return s.await(ctx, w)
}

// checkArrival refuses an arrival of weight n before it takes a place:
// its weight is above the capacity this process last heard of, or ctx
// has ended already.
func (s *Semaphore) checkArrival(ctx context.Context, n int) error {
	s.mu.Lock()
	capacity := s.capacity
	s.mu.Unlock()
	if n > capacity {
		return s.tooHeavy(n, capacity)
	}
	return ctx.Err()
}

// queueLocalLocked puts w at the tail of the local queue and serves the
// queue's head: while Redis is away, or the waiters stay back (settling).
func (s *Semaphore) queueLocalLocked(w *waiter) {
	w.local = true
	s.localQ = append(s.localQ, w)
	s.serveLocalLocked()
}

// directLocked reports whether w goes out at once from its caller's
// goroutine, marking it sent and taking the releases pending with it;
// else it queues w for the dispatcher.
//
// A process has one exchange in flight at a time, so everything asked
// for meanwhile goes out together in the next (and a leave can never
// overtake its arrival). A lone arrival (no exchange in flight, and
// no other caller of this process waiting or holding) goes out at once
// from this goroutine: no hop to the dispatcher and back. It carries
// the releases pending, so a caller that released and acquires again
// pays one round trip; the rest (others' arrivals, leaves) is the
// dispatcher's, because this exchange is bound to this caller's ctx.
// Where other callers are busy, the dispatcher batches them all (64
// looping callers on 64 permits in 4 processes: 8.5 → 15 grants per
// script call).
func (s *Semaphore) directLocked(w *waiter) (direct bool, releases []releaseOp) {
	direct = !s.sending && len(s.pendAcquire) == 0 && len(s.holders) == 0 && len(s.waiters) == 1
	if !direct {
		s.pendAcquire = append(s.pendAcquire, w)
		return false, nil
	}
	s.sending = true
	w.sent = true
	w.deadline = time.Now().Add(s.cfg.QueueTTL)
	releases, s.pendRelease = s.pendRelease, nil
	return true, releases
}

// sendDirect runs the exchange of a lone arrival w, with the releases
// pending, under its caller's ctx, and leaves what came meanwhile to the
// dispatcher.
func (s *Semaphore) sendDirect(ctx context.Context, w *waiter, releases []releaseOp) {
	if s.trace != nil {
		// The dispatcher follows Redis's reachability: a frozen
		// Redis switches this exchange to local within the probe's
		// bound rather than its own.
		s.kick()
	}
	s.exchange(ctx, batch{acquires: []*waiter{w}, releases: releases, wantWait: true})
	s.mu.Lock()
	s.doneSendingLocked()
	more := s.pendingLocked()
	s.mu.Unlock()
	if more {
		s.kick() // what came meanwhile is the dispatcher's
	}
}

// await waits for w to be decided, or gives its place up when ctx ends
// first.
func (s *Semaphore) await(ctx context.Context, w *waiter) (_ *Permit, queued, local bool, _ error) {
	select {
	case <-w.ch:
		// A ticket is written only before the waiter is decided.
		return w.permit, w.ticket > 0, w.local, w.err
	case <-ctx.Done():
	}
	s.mu.Lock()
	if w.done {
		// Decided while ctx ended: the outcome stands.
		s.mu.Unlock()
		return w.permit, w.ticket > 0, w.local, w.err
	}
	local = w.local
	s.abandonLocked(w)
	queued = w.ticket > 0
	last := s.lastErr
	s.mu.Unlock()
	s.kick()
	if last != nil {
		// Redis is unreachable: say why, as well as that ctx ended.
		return nil, queued, local, s.callError(last).WithCtx(ctx.Err())
	}
	return nil, queued, local, ctx.Err()
}

// idOf is the id of arrival seq of weight n in lane (laneOf's suffix).
// The weight and lane travel in the id (see sync.lua), so any process can
// grant it; weight 1 in the default lane keeps the plain id.
func (s *Semaphore) idOf(seq uint64, n int, lane string) string {
	id := s.proc + ":" + strconv.FormatUint(seq, 10)
	if n > 1 {
		id += ":" + strconv.Itoa(n)
	}
	return id + lane
}

// newID is a fresh id of weight n in lane.
func (s *Semaphore) newID(n int, lane string) string { return s.idOf(s.nextID.Add(1), n, lane) }

// Do acquires a permit, runs fn, and releases the permit after fn returns,
// even if fn panics. fn's context is cancelled, with cause ErrLeaseLost,
// if the lease is lost while fn runs. Do returns Acquire's error, or fn's
// error, or ErrLeaseLost if fn succeeded but the lease was lost before it
// was released.
func (s *Semaphore) Do(ctx context.Context, fn func(ctx context.Context) error) (err error) {
	p, err := s.Acquire(ctx)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	stop := make(chan struct{})
	var watch sync.WaitGroup
	watch.Add(1)
	go func() {
		defer watch.Done()
		select {
		case <-p.lost:
			cancel(ErrLeaseLost)
		case <-stop:
		}
	}()
	defer func() {
		close(stop)
		watch.Wait()
		cancel(nil)
		// Release even when ctx has ended; a release that fails leaves a
		// lease that expires on its own.
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), s.callTimeout)
		relErr := p.Release(rctx)
		rcancel()
		if err == nil && errors.Is(relErr, ErrLeaseLost) {
			err = ErrLeaseLost
		}
	}()
	return fn(fctx)
}
