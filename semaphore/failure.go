package semaphore

import (
	"context"
	"errors"
	"time"

	"github.com/sluicehq/sluice/internal/rediscall"
)

// An exchange that got no usable reply: what caused it, and what fails or
// is retried.

// exchangeFailed handles an exchange of b that got no usable reply: err
// is the call's error (runErr) or, when the call succeeded, the reply's.
// ctx is the exchange's caller's, tctx the exchange's own, with its time
// limit; sent is when the call left.
func (s *Semaphore) exchangeFailed(ctx, tctx context.Context, b batch, err, runErr error, sent time.Time) {
	// A direct arrival's caller's ctx ended (go-redis may report its
	// deadline as a socket timeout a moment early): Acquire gives
	// the place up and returns ctx's error, as when it ends in the
	// queue. Otherwise only this exchange's own time limit makes it
	// "no answer".
	if dl, ok := ctx.Deadline(); ctx.Err() != nil || (ok && time.Until(dl) < time.Millisecond) {
		s.failed(b, err, true)
		return
	}
	byAway := errors.Is(runErr, errAway)
	timedOut := !byAway && tctx.Err() != nil && ctx.Err() == nil
	if s.trace != nil && runErr != nil {
		if cause, away := s.awayCause(runErr, byAway, timedOut, sent); away {
			s.goLocal(b, cause)
			return
		}
	}
	s.failed(b, s.cause(err, timedOut), false)
}

// cause is what made an exchange fail, as callers should read it: a
// *rediscall.CallError naming Redis's or the network's error ("connection
// refused"). When the exchange ran out of its own time limit, go-redis
// reports only that limit's context.DeadlineExceeded, which is not the
// caller's deadline and must not match it: the cause then says no answer
// came within the limit, and names why if a dial to the server shows it
// (connection refused), or else the last error Redis gave before, if any
// was a reason.
func (s *Semaphore) cause(err error, timedOut bool) *rediscall.CallError {
	if !timedOut {
		return s.callError(err)
	}
	s.mu.Lock()
	last := s.lastErr
	s.mu.Unlock()
	c := s.callError(rediscall.ErrNoAnswer)
	c.Within = s.callTimeout
	var lastCall *rediscall.CallError
	if perr := rediscall.Probe(context.Background(), s.rdb); perr != nil {
		c.Err = perr
	} else if errors.As(last, &lastCall) && !errors.Is(lastCall.Err, rediscall.ErrNoAnswer) {
		c.Err = lastCall.Err
	}
	return c
}

// callError is err, the failure of a call to Redis, as this semaphore's
// CallError; one already is returned as it is.
func (s *Semaphore) callError(err error) *rediscall.CallError {
	var c *rediscall.CallError
	if errors.As(err, &c) {
		return c
	}
	return &rediscall.CallError{Prefix: "semaphore", Name: s.cfg.Name, Addr: rediscall.Addr(s.rdb), Err: err}
}

// failed handles a batch Redis did not answer, because of cause. Its
// effects are unknown, so releases and leaves are retried while they can
// still matter, and arrivals fail (and leave, in case they were
// recorded) with an error naming cause; so do the waiters already queued,
// whose places this process cannot keep while Redis does not answer:
// that bounds how long Acquire blocks while Redis is away (see Acquire).
// cause is kept for the waiters whose ctx ends meanwhile. callerEnded
// means the exchange failed because its caller's ctx ended: the arrivals
// are left to their Acquire, which gives them up.
func (s *Semaphore) failed(b batch, cause error, callerEnded bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failedLocked(b, cause, callerEnded)
}

// failedLocked is failed with s.mu held.
func (s *Semaphore) failedLocked(b batch, cause error, callerEnded bool) {
	if !callerEnded {
		s.noteFailureLocked(cause)
	}
	err := s.failureError(cause)
	if b.set != nil {
		b.set.done <- err
	}
	s.retryLocked(b, callerEnded)
	if callerEnded {
		return // the arrivals are their Acquire's to give up
	}
	s.failAllLocked(b.acquires, err)
	s.failQueuedLocked(err)
	if b.returning {
		// Redis answers but refused the registration (READONLY, OOM):
		// the waiters kept back fail as queued ones do; the permits held
		// stay held and their registration is tried again at each beat.
		s.failAllLocked(s.localQ, err)
		s.localQ = nil
	}
}

// noteFailureLocked keeps cause as the reason calls to Redis fail, for
// the waiters whose ctx ends meanwhile, and tells the Logger at the first
// failure after a success.
func (s *Semaphore) noteFailureLocked(cause error) {
	if l := s.cfg.Logger; l != nil && s.lastErr == nil {
		l.Warn("sluice: semaphore's calls to Redis fail: arrivals fail, waiters and holders keep trying until their ctx or lease ends",
			"semaphore", s.cfg.Name, "err", cause)
	}
	s.lastErr = cause
}

// failureError is the error callers of a batch that failed because of
// cause read: the call's error, or cause itself when this process knows
// no share, which says more.
func (s *Semaphore) failureError(cause error) error {
	if errors.As(cause, new(*noShareError)) {
		return cause
	}
	return s.callError(cause)
}

// retryLocked keeps what b sent for another exchange while it can still
// matter: its releases and leaves, and a leave for each of its arrivals
// in case Redis recorded them. The releases go again at once when only
// an arrival's caller gave up (callerEnded), else at the next beat.
func (s *Semaphore) retryLocked(b batch, callerEnded bool) {
	now := time.Now()
	for _, r := range b.releases {
		if !now.Before(r.until) {
			continue
		}
		if callerEnded {
			// Only an arrival's caller gave up: send them again now (the
			// direct lane kicks the dispatcher when its exchange ends).
			s.pendRelease = append(s.pendRelease, releaseOp{id: r.id, until: r.until})
		} else {
			s.retryRelease = append(s.retryRelease, releaseOp{id: r.id, until: r.until})
		}
	}
	for _, l := range b.leaves {
		if now.Before(l.until) {
			s.retryLeave = append(s.retryLeave, l)
		}
	}
	for _, w := range b.acquires {
		s.retryLeave = append(s.retryLeave, leaveOp{id: w.id, until: w.deadline})
	}
}

// failAllLocked fails with err each of ws not decided yet.
func (s *Semaphore) failAllLocked(ws []*waiter, err error) {
	for _, w := range ws {
		if !w.done {
			w.err = err
			s.finishLocked(w)
		}
	}
}

// failQueuedLocked fails with err the waiters queued in Redis, whose
// places this process cannot keep while Redis does not answer, and
// leaves their places at a later exchange.
func (s *Semaphore) failQueuedLocked(err error) {
	for _, w := range s.waiters {
		if w.done || !w.sent || w.ticket <= 0 {
			continue // not queued in Redis: its own exchange decides it
		}
		s.retryLeave = append(s.retryLeave, leaveOp{id: w.id, until: w.deadline})
		w.err = err
		s.finishLocked(w)
	}
}
