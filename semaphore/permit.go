package semaphore

import (
	"context"
	"time"
)

type permitState int

const (
	held permitState = iota
	released
	lost
)

// Permit is one place in a Semaphore, of the weight it was acquired with,
// held until Release. Its lease is renewed in the background by its
// Semaphore. Its methods are safe for concurrent use.
type Permit struct {
	s      *Semaphore
	id     string
	weight int
	lost   chan struct{}
	local  bool // granted from the local share (Config.Fallback)

	// Guarded by s.mu.
	state    permitState
	deadline time.Time   // the lease in Redis lasts at least until then
	timer    *time.Timer // fires at deadline unless a renewal moved it; nil for a local grant until registered
	// unregistered: held while Redis was away, so Redis may not have it;
	// it is written there at the return (fallback.go). registered: Redis
	// was given a lease for it since its local grant.
	unregistered, registered bool
}

// inRedis reports that Redis may hold a lease for p. Called with s.mu held.
func (p *Permit) inRedis() bool { return !p.local || p.registered }

// stopTimer stops the lease timer, if any. Called with s.mu held.
func (p *Permit) stopTimer() {
	if p.timer != nil {
		p.timer.Stop()
	}
}

// Release gives the place back, its whole weight at once, and returns
// without waiting for Redis: the release goes out with this Semaphore's
// next exchange (at once when none is in flight, or together with an
// arrival), so a caller that releases and acquires again pays one round
// trip, not two. Until Redis has it, the place stays taken there, never
// given twice; Close sends every release still pending, so a process
// that exits after Close leaves no permit behind.
//
// Releasing twice returns nil and does nothing; releasing a permit whose
// lease is known lost (Lost is closed) returns ErrLeaseLost and touches no
// one else's place. A release Redis finds no longer held (the lease ended
// there unnoticed, as after a restart without persistence) counts in
// Stats.LeasesLost and is logged. A release that cannot reach Redis is
// retried until the lease would have ended anyway. ctx is not used: the
// release no longer waits for anything.
//
// With Config.Fallback, a permit granted from the local share while Redis
// is away is released locally, at once (the next local waiter gets its
// place); one held from Redis before the outage is released in Redis
// when it answers again.
func (p *Permit) Release(ctx context.Context) error {
	s := p.s
	s.mu.Lock()
	switch p.state {
	case released:
		s.mu.Unlock()
		return nil
	case lost:
		p.state = released
		s.mu.Unlock()
		return ErrLeaseLost
	}
	if op, send := s.releaseLocked(p); send {
		s.pendRelease = append(s.pendRelease, op)
	}
	s.serveLocalLocked()
	// An exchange in flight kicks the dispatcher when it returns.
	idle := !s.sending
	s.mu.Unlock()
	if idle {
		s.kick()
	}
	return nil
}

// Lost returns a channel closed when the lease ends before Release: it
// could not be renewed in time, Redis no longer has it, or the Semaphore
// was closed. Work protected by the permit should stop then; another
// caller may already hold the place.
//
// With Config.Fallback, no lease is lost while Redis is away: a permit
// held then (granted from the local share, or held from Redis since
// before the outage) has no lease to renew, and its Lost closes only at
// Close. When Redis answers again the permit is registered there with a
// fresh lease, and from then on is renewed and can be lost as any other.
func (p *Permit) Lost() <-chan struct{} { return p.lost }

// validUntil is the conservative local end of the lease (for tests).
func (p *Permit) validUntil() time.Time {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	return p.deadline
}
