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

	// Guarded by s.mu.
	state    permitState
	deadline time.Time   // the lease in Redis lasts at least until then
	timer    *time.Timer // fires at deadline unless a renewal moved it
}

// Release gives the place back, its whole weight at once. Releasing twice returns nil and does
// nothing; releasing a permit whose lease was lost returns ErrLeaseLost and
// does not touch anyone else's place. On other errors (Redis unreachable)
// the place is freed when its lease runs out, within Config.LeaseTTL. An
// error matching ctx.Err() means ctx ended before Redis answered; the
// release still happens.
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
	done := make(chan error, 1)
	op := s.releaseLocked(p, done)
	if s.releasing {
		// One is in flight: this one goes with the next, sent by the
		// goroutine that sent that one.
		s.pendDirect = append(s.pendDirect, op)
		s.mu.Unlock()
		select {
		case err := <-done:
			return err
		case <-ctx.Done():
			return ctx.Err() // the release goes out all the same
		}
	}
	s.releasing = true
	s.mu.Unlock()
	// Sent from here rather than through the dispatcher: the next waiter's
	// turn should not wait behind an exchange already in flight.
	s.exchange(ctx, batch{releases: []releaseOp{op}})
	s.sendReleases()
	return <-done
}

// sendReleases sends the releases that queued while one was in flight,
// together, a few rounds at most; what still comes after goes to the
// dispatcher, so no caller of Release carries others' for long.
func (s *Semaphore) sendReleases() {
	for range 3 {
		s.mu.Lock()
		ops := s.pendDirect
		s.pendDirect = nil
		if len(ops) == 0 {
			s.releasing = false
			s.mu.Unlock()
			return
		}
		s.mu.Unlock()
		// Others' releases: not bound to this caller's ctx.
		s.exchange(context.Background(), batch{releases: ops})
	}
	s.mu.Lock()
	s.pendRelease = append(s.pendRelease, s.pendDirect...)
	s.pendDirect = nil
	s.releasing = false
	s.mu.Unlock()
	s.kick()
}

// Lost returns a channel closed when the lease ends before Release: it
// could not be renewed in time, Redis no longer has it, or the Semaphore
// was closed. Work protected by the permit should stop then; another
// caller may already hold the place.
func (p *Permit) Lost() <-chan struct{} { return p.lost }

// validUntil is the conservative local end of the lease (for tests).
func (p *Permit) validUntil() time.Time {
	p.s.mu.Lock()
	defer p.s.mu.Unlock()
	return p.deadline
}
