package semaphore

import (
	"strings"
	"time"
)

// This process's waiters and permits: a waiter decided or given up, a
// permit granted, its lease checked, lost or released, and the grant
// notifications that wake waiters.

// listenLocked listens for grant notifications while callers wait. Called
// with mu held.
func (s *Semaphore) listenLocked() {
	if s.stopListen == nil && !s.closed {
		// A notification published before Redis confirms the
		// subscription is lost: a beat then asks Redis.
		s.stopListen = s.hub.Listen(s.chanPrefix+s.proc, s.wake, s.requestBeat)
	}
}

// unlistenLocked stops listening once nobody waits. Called with mu held.
func (s *Semaphore) unlistenLocked() {
	if s.stopListen != nil && (len(s.waiters) == 0 || s.closed) {
		s.stopListen()
		s.stopListen = nil
	}
}

// abandonLocked gives up w's place: an Acquire's ctx ended.
func (s *Semaphore) abandonLocked(w *waiter) {
	w.done = true
	delete(s.waiters, w.id)
	s.unlistenLocked()
	if w.local {
		s.dropLocalLocked(w)
		return
	}
	if !w.sent {
		for i, x := range s.pendAcquire {
			if x == w {
				s.pendAcquire = append(s.pendAcquire[:i], s.pendAcquire[i+1:]...)
				break
			}
		}
		return
	}
	// It may be in the queue, or granted already: leave handles both.
	s.pendLeave = append(s.pendLeave, leaveOp{id: w.id, until: time.Now().Add(s.cfg.QueueTTL)})
}

// finishLocked ends w with w.permit or w.err set.
func (s *Semaphore) finishLocked(w *waiter) {
	w.done = true
	delete(s.waiters, w.id)
	s.unlistenLocked()
	close(w.ch)
}

// grantLocked turns w into a permit valid until deadline. A deadline in
// the past (this process stalled) is not a grant: the next beat asks Redis
// again.
func (s *Semaphore) grantLocked(w *waiter, deadline time.Time) {
	if w.done {
		return
	}
	d := time.Until(deadline)
	if d <= 0 {
		s.beatDue = true
		return
	}
	p := &Permit{s: s, id: w.id, weight: w.weight, deadline: deadline, lost: make(chan struct{})}
	p.timer = time.AfterFunc(d, func() { s.checkLease(p) })
	s.holders[p.id] = p
	s.held.Add(int64(p.weight))
	w.permit = p
	s.finishLocked(w)
}

// checkLease runs when p's deadline may have passed.
func (s *Semaphore) checkLease(p *Permit) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.state != held || p.unregistered {
		return // no lease to lose while Redis is away (fallback.go)
	}
	if d := time.Until(p.deadline); d > 0 {
		p.timer.Reset(d)
		return
	}
	s.loseLocked(p, "not renewed in time")
	s.kick()
}

// loseLocked ends a held permit whose lease is gone or going, and frees its
// place in Redis in case the lease still stands there. why says how it
// was lost, for Stats and the Logger; "" when Close ends it, which is no
// loss to report.
func (s *Semaphore) loseLocked(p *Permit, why string) {
	p.state = lost
	p.stopTimer()
	delete(s.holders, p.id)
	s.held.Add(-int64(p.weight))
	if why != "" {
		s.leasesLost.Add(1)
		if l := s.cfg.Logger; l != nil {
			// Rare, and said under s.mu so it comes before anything the
			// loss leads to.
			l.Warn("sluice: semaphore permit's lease lost while held: another caller may hold its place now",
				"semaphore", s.cfg.Name, "permit", p.id, "weight", p.weight, "why", why)
		}
	}
	close(p.lost)
	if p.inRedis() {
		s.pendRelease = append(s.pendRelease, releaseOp{id: p.id, until: time.Now().Add(s.cfg.LeaseTTL)})
	}
}

// releaseLocked ends a held permit at its holder's request; send reports
// that Redis may hold its lease, which op frees.
func (s *Semaphore) releaseLocked(p *Permit) (op releaseOp, send bool) {
	p.state = released
	p.stopTimer()
	delete(s.holders, p.id)
	s.held.Add(-int64(p.weight))
	// A permit held through an outage may have lost its lease in Redis
	// unnoticed: no loss to report if Redis no longer has it.
	return releaseOp{id: p.id, until: p.deadline, asked: !p.unregistered}, p.inRedis()
}

// wake grants the waiters named in a notification. Their grant keeps
// their queue lease, which lasts at least until their local deadline.
func (s *Semaphore) wake(payload string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(payload) > 0 {
		id := payload
		if i := strings.IndexByte(payload, ' '); i >= 0 {
			id, payload = payload[:i], payload[i+1:]
		} else {
			payload = ""
		}
		if refused, ok := strings.CutPrefix(id, "!"); ok {
			if w := s.waiters[refused]; w != nil && w.sent && !w.done {
				w.err = s.loweredBelow(w.weight)
				s.finishLocked(w)
			}
			continue
		}
		if w := s.waiters[id]; w != nil && w.sent {
			s.grantLocked(w, w.deadline)
		}
	}
	if s.beatDue {
		s.kick()
	}
}
