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

	// Burst is the most calls that may start at one instant, as
	// golang.org/x/time/rate's burst (rate.NewLimiter(r, 100) lets 100
	// through at once) and package bucket's Capacity. Zero means 1.
	//
	// After an idle spell Burst callers start at once and the ones after
	// them wait for the rate; only idle time earns the burst back. Burst is
	// also the largest cost EnterN accepts. In any window of length T the
	// starts (with EnterN, their summed costs) stay below
	// max(Burst, 1) + T×Rate/Period: with Burst 0 or 1, at most Rate in any
	// window of one Period; with a larger Burst, at most Burst+Rate−1.
	Burst int

	// MaxQueue refuses a caller with ErrQueueFull when that many callers
	// already wait, whatever their costs. Zero means no bound.
	MaxQueue int

	// MaxWait refuses a caller with ErrWaitTooLong when it would wait longer
	// than this (counting the current sleeper's remaining time, the costs of
	// everyone queued behind it and the caller's own). Zero means no bound.
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
	q     queue
	burst int // the most one EnterN may take, >= 1
}

// NewRate returns a Rate configured by cfg, or an error wrapping
// ErrConfig if cfg is out of range.
func NewRate(cfg RateConfig) (*Rate, error) {
	switch {
	case cfg.Rate < 1:
		return nil, invalid("Rate is %d, must be at least 1", cfg.Rate)
	case cfg.Period < 0:
		return nil, invalid("Period is %v, must not be negative", cfg.Period)
	case cfg.Burst < 0:
		return nil, invalid("Burst is %d, must not be negative", cfg.Burst)
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
	// The bucket holds Burst tokens. With a bucket of one (Burst 0 or 1) a
	// token is spent as soon as it arrives, so starts are exactly one
	// interval apart.
	burst := max(cfg.Burst, 1)
	s := &rateSchedule{lim: rate.NewLimiter(limit, burst), limit: float64(limit)}
	return &Rate{q: queue{sched: s, maxQueue: cfg.MaxQueue, maxWait: cfg.MaxWait}, burst: burst}, nil
}

// Enter returns nil when the caller may start one call. It returns
// ErrQueueFull or ErrWaitTooLong when the caller is refused, and ctx.Err()
// when ctx ends first (a caller whose turn came at the same moment is let
// through instead). Neither a refused nor a cancelled caller consumes
// anything.
func (r *Rate) Enter(ctx context.Context) error {
	return r.q.enter(ctx, 1)
}

// EnterN is Enter for a caller that costs n calls, as x/time/rate's WaitN
// and package bucket's EnterN: it takes n tokens at once when its turn comes.
// Callers wait in arrival order whatever their cost: a large cost at the
// front waits for its tokens and the callers behind it wait too, never
// overtaking it. MaxQueue counts callers, whatever their cost; MaxWait counts
// the costs of the callers ahead. A caller that gives up before its turn
// gives its whole cost back.
//
// n = 0 returns at once: nil, or ctx.Err() if ctx has already ended. An n
// above Burst could never be granted and is refused at once with an error
// matching ErrCostExceedsCapacity (not sluice.ErrLimited); a negative n is
// an error.
func (r *Rate) EnterN(ctx context.Context, n int) error {
	if err := checkCost(n, "Burst", r.burst); err != nil {
		return err
	}
	if n == 0 {
		return ctx.Err()
	}
	return r.q.enter(ctx, n)
}

// Do waits with Enter, then runs fn with ctx and returns fn's error. It
// returns Enter's error without running fn if Enter fails.
func (r *Rate) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	if err := r.q.enter(ctx, 1); err != nil {
		return err
	}
	return fn(ctx)
}

// Waiting returns the number of callers waiting in Enter or EnterN right
// now.
func (r *Rate) Waiting() int {
	return r.q.waiting()
}

// rateSchedule books starts as x/time/rate reservations.
type rateSchedule struct {
	lim   *rate.Limiter
	limit float64          // lim's limit in tokens per second
	last  rate.Reservation // the most recent booking, for unbook
}

func (s *rateSchedule) book(now time.Time, n int) time.Time {
	r := s.lim.ReserveN(now, n) // ok: the queue never books more than the burst
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
