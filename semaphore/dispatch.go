package semaphore

import (
	"context"
	"runtime"
	"time"
)

// The dispatcher's loop: the goroutine that runs this process's exchanges
// with Redis one at a time while there is work, the batch it takes for
// each, and how callers wake it and wait for it.

// dispatch runs the exchanges with Redis one at a time: whatever callers
// ask for while one is in flight goes out together in the next.
//
// It runs while there is work (kick starts it) and returns once there is
// none: an idle Semaphore runs no goroutine. With Config.Fallback it also
// follows Redis's reachability while it runs (fallback.go), and traces
// this process at its beats.
func (s *Semaphore) dispatch() {
	beat := time.NewTicker(s.cfg.beat())
	defer beat.Stop()
	if s.trace != nil {
		defer s.hub.Watch()()
	}
	for first := true; ; first = false {
		var changed <-chan struct{}
		var settled <-chan time.Time
		if s.trace != nil {
			changed, settled = s.followReach()
		}
		if !first {
			if s.idle() {
				return
			}
			select {
			case <-s.kickCh:
			case <-beat.C:
				s.requestBeat()
				s.sendTraceIfOnRedis()
			case <-changed:
			case <-settled:
			}
			if s.trace != nil {
				s.followReach()
			}
		}
		for {
			// Before each exchange: the callers the last reply woke (or a
			// burst) get to release and arrive again, and go in this one.
			s.gather()
			b, closed, busy := s.take()
			if busy {
				break // a direct arrival's exchange: it kicks when done
			}
			if b.empty() {
				if closed {
					s.dmu.Lock()
					s.dispatching = false
					s.dmu.Unlock()
					return
				}
				break
			}
			b.wantWait = true
			s.exchange(context.Background(), b)
			s.mu.Lock()
			s.doneSendingLocked()
			s.mu.Unlock()
		}
	}
}

// gather lets callers made runnable together (a burst) queue up before the
// exchange, so they share it instead of trickling into the next one: it
// yields while arrivals keep coming, a few times at most.
func (s *Semaphore) gather() {
	n := -1
	for range 8 {
		s.mu.Lock()
		m := len(s.pendAcquire) + len(s.pendRelease)
		s.mu.Unlock()
		if m == n {
			return
		}
		n = m
		runtime.Gosched()
	}
}

// take collects the next batch and marks it in flight; busy reports an
// exchange already in flight (nothing taken).
func (s *Semaphore) take() (b batch, closed, busy bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sending {
		return b, s.closed, true
	}
	if s.mode == onLocal {
		// Redis is away: releases and leaves wait for its return.
		s.beatDue = false
		return b, s.closed, false
	}
	b.returning = s.mode == registering
	now := time.Now()
	b.releases, s.pendRelease = s.pendRelease, nil
	b.leaves, s.pendLeave = s.pendLeave, nil
	if s.beatDue && !s.closed {
		s.beatDue = false
		b.releases = append(b.releases, s.retryRelease...)
		b.leaves = append(b.leaves, s.retryLeave...)
		s.retryRelease, s.retryLeave = nil, nil
		for _, p := range s.holders {
			switch {
			case p.unregistered:
				b.registers = append(b.registers, p)
			case !now.Before(p.deadline):
				s.loseLocked(p, "not renewed in time")
			default:
				b.renews = append(b.renews, p)
			}
		}
		// loseLocked queued releases.
		b.releases = append(b.releases, s.pendRelease...)
		s.pendRelease = nil
		for _, w := range s.waiters {
			// Queued, as a reply said (tickets start at 1): an arrival
			// still in flight is not refreshed.
			if w.sent && w.ticket > 0 {
				b.refresh = append(b.refresh, w)
			}
		}
	}
	b.acquires, s.pendAcquire = s.pendAcquire, nil
	for _, w := range b.acquires {
		w.sent = true
		w.deadline = now.Add(s.cfg.QueueTTL)
	}
	s.sending = !b.empty()
	if b.returning && !s.sending {
		s.settleLocked(0) // nothing to register or send
	}
	return b, s.closed, false
}

// doneSendingLocked ends the exchange in flight and wakes flush.
func (s *Semaphore) doneSendingLocked() {
	s.sending = false
	if s.sent != nil {
		close(s.sent)
		s.sent = nil
	}
}

// flush waits until the releases made so far in this process have been
// sent to Redis (or failed, and wait for a later beat), or ctx ends.
func (s *Semaphore) flush(ctx context.Context) error {
	for {
		s.mu.Lock()
		if (len(s.pendRelease) == 0 && !s.sending) || s.closed || s.mode == onLocal {
			// Close sends what is pending itself; while Redis is away
			// nothing is sent before it answers.
			s.mu.Unlock()
			return nil
		}
		if s.sent == nil {
			s.sent = make(chan struct{})
		}
		ch, idle := s.sent, !s.sending
		s.mu.Unlock()
		if idle {
			s.kick()
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// pendingLocked reports work for the dispatcher.
func (s *Semaphore) pendingLocked() bool {
	return len(s.pendAcquire)+len(s.pendRelease)+len(s.pendLeave) > 0 || s.beatDue
}

// kick wakes the dispatcher, starting it if it is not running. It may be
// called with mu held.
func (s *Semaphore) kick() {
	select {
	case s.kickCh <- struct{}{}:
	default:
	}
	s.dmu.Lock()
	defer s.dmu.Unlock()
	if !s.dispatching && s.bg.Go(func(context.Context) { s.dispatch() }) {
		s.dispatching = true
	}
}

// idle reports, and marks the dispatcher stopped, when it has no work left:
// nobody waits, nothing is held, nothing is pending or to retry.
func (s *Semaphore) idle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mode == onLocal {
		s.pruneLocked()
	}
	if len(s.waiters)+len(s.holders)+len(s.retryRelease)+len(s.retryLeave) > 0 || s.sending || s.pendingLocked() {
		return false
	}
	s.dmu.Lock()
	s.dispatching = false
	s.dmu.Unlock()
	return true
}

// requestBeat makes the dispatcher renew, refresh and poll soon.
func (s *Semaphore) requestBeat() {
	s.mu.Lock()
	s.beatDue = true
	s.mu.Unlock()
	s.kick()
}
