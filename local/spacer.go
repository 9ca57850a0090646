package local

import (
	"context"
	"time"

	"github.com/sluicehq/sluice"
)

var (
	_ sluice.RateLimiter = (*Spacer)(nil)
	_ sluice.StatsReader = (*Spacer)(nil)
)

// SpacerConfig configures a Spacer.
type SpacerConfig struct {
	// Space is the minimum time between two starts; it must be positive.
	Space time.Duration

	// Align puts every start on a multiple of Space (counted on the wall
	// clock from the zero time, as time.Time.Truncate does, so a Space of a
	// second starts calls on whole seconds). A start then waits for the
	// first multiple at or after the time the spacing allows, so two starts
	// are still at least Space apart. False means starts are not aligned.
	Align bool

	// Observer, when set, is told of every Enter and Do's entry once it
	// returns, as a sluice.Event of Limiter "local.spacer": the metrics
	// packages implement it. It runs on the caller's goroutine. nil costs
	// nothing.
	Observer sluice.Observer
}

// Spacer starts calls at least Space apart, first come first served. Like
// Rate, a caller that gives up leaves the queue and gives back its slot.
//
// The zero value is not usable; create one with NewSpacer. A Spacer is safe
// for concurrent use.
type Spacer struct {
	q queue
}

// NewSpacer returns a Spacer configured by cfg, or an error wrapping
// sluice.ErrConfig if Space is not positive.
func NewSpacer(cfg SpacerConfig) (*Spacer, error) {
	if cfg.Space <= 0 {
		return nil, invalid("Space is %v, must be positive", cfg.Space)
	}
	return &Spacer{q: queue{sched: &spaceSchedule{space: cfg.Space, align: cfg.Align}, tally: newTally("local.spacer", cfg.Observer)}}, nil
}

// Enter returns nil when the caller may start, and ctx.Err() when ctx ends
// first (a caller whose turn came at the same moment is let through
// instead); a cancelled caller gives back its slot.
func (s *Spacer) Enter(ctx context.Context) error {
	return s.q.enter(ctx, 1)
}

// Do waits with Enter, then runs fn with ctx and returns fn's error. It
// returns Enter's error without running fn if Enter fails.
func (s *Spacer) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	if err := s.q.enter(ctx, 1); err != nil {
		return err
	}
	return fn(ctx)
}

// Waiting returns the number of callers waiting in Enter right now.
func (s *Spacer) Waiting() int {
	return s.q.waiting()
}

// Stats returns the Spacer's figures (sluice.Stats): callers waiting now,
// and the results of its calls since NewSpacer, as its Observer was told
// them. It is safe for concurrent use.
func (s *Spacer) Stats() sluice.Stats {
	return s.q.tally.Stats()
}

// spaceSchedule books starts Space apart, optionally aligned. Every start
// costs 1: Spacer has no EnterN.
type spaceSchedule struct {
	space time.Duration
	align bool
	last  time.Time // the most recent start; zero before the first
	prev  time.Time // the start before last, for unbook
}

func (s *spaceSchedule) next(now time.Time) time.Time {
	at := s.last.Add(s.space)
	if s.last.IsZero() || at.Before(now) {
		at = now
	}
	if s.align {
		// Round up, never down or to the nearest multiple, either of
		// which could start a call less than Space after the last one.
		// Truncate works on the wall clock; the result keeps at's
		// monotonic reading.
		if off := at.Sub(at.Truncate(s.space)); off > 0 {
			at = at.Add(s.space - off)
		}
	}
	return at
}

func (s *spaceSchedule) book(now time.Time, _ int) time.Time {
	at := s.next(now)
	s.prev, s.last = s.last, at
	return at
}

func (s *spaceSchedule) unbook(time.Time) {
	s.last = s.prev
}

func (s *spaceSchedule) estimate(now time.Time, k int) time.Time {
	return s.next(now).Add(time.Duration(k-1) * s.space)
}
