package local

import (
	"context"
	"math"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice"
)

var _ sluice.RateLimiter = (*Rate)(nil)

// RateConfig configures a Rate. Only Rate is required.
type RateConfig struct {
	// Rate is the number of starts allowed per Period, at least 1. Starts are
	// spread evenly: one every Period/Rate.
	Rate int

	// Period is the window Rate applies to. Zero means one second.
	Period time.Duration

	// Burst is the number of starts allowed above the rate: after an idle
	// spell, 1+Burst callers may start at once, and the callers that follow
	// pay the extra back by waiting. Only idle time earns the burst back.
	// Zero means none: any window of length Period then holds at most Rate
	// starts; with a burst, at most Rate+Burst.
	Burst int

	// MaxQueue refuses a caller with ErrQueueFull when that many callers
	// already wait. Zero means no bound.
	MaxQueue int

	// MaxWait refuses a caller with ErrWaitTooLong when it would wait longer
	// than this (counting the current sleeper's remaining time and everyone
	// queued behind it). Zero means no bound.
	MaxWait time.Duration
}

// roundingGuard is added to the interval between tokens so that
// x/time/rate's float arithmetic and truncation to whole nanoseconds can
// never start a call before its exact time (it could, by up to 1 ns, which
// lets Rate+1 starts into one Period).
const roundingGuard = 2 * time.Nanosecond

// Rate lets at most Rate calls start per Period, first come first served.
// Callers that must wait queue in arrival order; a caller that gives up (its
// context ends) leaves the queue and the ones behind it move up.
//
// The zero value is not usable; create one with NewRate. A Rate is safe for
// concurrent use.
type Rate struct {
	q queue
}

// NewRate returns a Rate configured by cfg, or an error wrapping
// ErrConfig if cfg is out of range.
func NewRate(cfg RateConfig) (*Rate, error) {
	switch {
	case cfg.Rate < 1:
		return nil, invalid("Rate is %d, must be at least 1", cfg.Rate)
	case cfg.Period < 0:
		return nil, invalid("Period is %v, must not be negative", cfg.Period)
	case cfg.Burst < 0 || cfg.Burst == math.MaxInt:
		return nil, invalid("Burst is %d, must be in [0, MaxInt)", cfg.Burst)
	case cfg.MaxQueue < 0:
		return nil, invalid("MaxQueue is %d, must not be negative", cfg.MaxQueue)
	case cfg.MaxWait < 0:
		return nil, invalid("MaxWait is %v, must not be negative", cfg.MaxWait)
	}
	period := cfg.Period
	if period == 0 {
		period = time.Second
	}
	interval := float64(period)/float64(cfg.Rate) + float64(roundingGuard)
	limit := rate.Limit(float64(time.Second) / interval)
	// The bucket holds one token plus the burst: with no burst, a token is
	// spent as soon as it arrives, so starts are exactly one interval apart.
	s := &rateSchedule{lim: rate.NewLimiter(limit, 1+cfg.Burst), limit: float64(limit)}
	return &Rate{q: queue{sched: s, maxQueue: cfg.MaxQueue, maxWait: cfg.MaxWait}}, nil
}

// Enter returns nil when the caller may start one call. It returns
// ErrQueueFull or ErrWaitTooLong when the caller is refused, and ctx.Err()
// when ctx ends first (a caller whose turn came at the same moment is let
// through instead). Neither a refused nor a cancelled caller consumes
// anything.
func (r *Rate) Enter(ctx context.Context) error {
	return r.q.enter(ctx)
}

// Do waits with Enter, then runs fn with ctx and returns fn's error. It
// returns Enter's error without running fn if Enter fails.
func (r *Rate) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	if err := r.q.enter(ctx); err != nil {
		return err
	}
	return fn(ctx)
}

// Waiting returns the number of callers waiting in Enter right now.
func (r *Rate) Waiting() int {
	return r.q.waiting()
}

// rateSchedule books starts as x/time/rate reservations.
type rateSchedule struct {
	lim   *rate.Limiter
	limit float64          // lim's limit in tokens per second
	last  rate.Reservation // the most recent booking, for unbook
}

func (s *rateSchedule) book(now time.Time) time.Time {
	r := s.lim.ReserveN(now, 1)
	s.last = *r
	return now.Add(r.DelayFrom(now))
}

func (s *rateSchedule) unbook(now time.Time) {
	s.last.CancelAt(now)
}

// estimate mirrors the arithmetic of rate.Limiter.ReserveN without reserving.
func (s *rateSchedule) estimate(now time.Time, k int) time.Time {
	tokens := s.lim.TokensAt(now) - float64(k)
	if tokens >= 0 {
		return now
	}
	d := (-tokens / s.limit) * float64(time.Second)
	if d > math.MaxInt64 {
		return now.Add(math.MaxInt64)
	}
	return now.Add(time.Duration(d))
}
