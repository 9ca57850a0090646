package local

import (
	"context"
	"math"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/upstream"
)

var (
	_ sluice.RateLimiter = (*Rate)(nil)
	_ upstream.Receiver  = (*Rate)(nil)
	_ sluice.StatsReader = (*Rate)(nil)
)

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

	// MaxQueue refuses a caller with sluice.ErrQueueFull when that many callers
	// already wait, whatever their costs. Zero means no bound.
	MaxQueue int

	// MaxWait refuses a caller with sluice.ErrWaitTooLong when it would wait longer
	// than this (counting the current sleeper's remaining time, the costs of
	// everyone queued behind it and the caller's own). Zero means no bound.
	MaxWait time.Duration

	// Observer, when set, is told of every Enter, EnterN and Do's entry
	// once it returns, as a sluice.Event of Limiter "local.rate": the
	// metrics packages implement it. It runs on the caller's goroutine.
	// nil costs nothing.
	Observer sluice.Observer
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
// sluice.ErrConfig if cfg is out of range.
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
	return &Rate{q: queue{sched: s, maxQueue: cfg.MaxQueue, maxWait: cfg.MaxWait, tally: newTally("local.rate", cfg.Observer)}, burst: burst}, nil
}

// Enter returns nil when the caller may start one call. It returns
// sluice.ErrQueueFull or sluice.ErrWaitTooLong when the caller is refused, and ctx.Err()
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
// matching sluice.ErrCostExceedsCapacity (not sluice.ErrLimited); a negative n is
// an error (a bug in the caller, which the Observer is not told of).
func (r *Rate) EnterN(ctx context.Context, n int) error {
	if err := checkCost(n, "Burst", r.burst); err != nil {
		if n < 0 {
			return err
		}
		return r.q.tally.once(ctx, err)
	}
	if n == 0 {
		return r.q.tally.once(ctx, ctx.Err())
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

// Feedback applies what the upstream said (implementing upstream.Receiver)
// to this Rate. It always returns nil: nothing here can fail, and it does
// not wait.
//
//   - Hold: when s.RetryAfter > 0, no caller starts before now +
//     s.RetryAfter. The bucket is emptied at once and refills during the
//     hold as usual, as if it had been empty at the hold's start: when the
//     hold ends, up to min(Burst, Rate per Period × the hold) callers start
//     at once (one with Burst 0 or 1), then the rest at the rate. Callers
//     already waiting are re-timed, not released together: the one at the
//     front of the queue gives its booking back and books again after the
//     hold, and the ones behind it book in their turn after it, in order. A
//     hold that comes during another extends it when it ends later, without
//     emptying the bucket again (it refills from the first hold's start);
//     one that ends sooner changes nothing.
//   - Sync: for each Quota of calls (Unit ""; quotas in other units are
//     ignored, since a Rate counts only calls), the tokens are brought down
//     to at most q.Remaining (never raised). With q.Remaining 0 and a
//     q.Reset, the bucket is empty at the reset and nobody starts before
//     it: refills resume at the reset, as the Receiver contract asks;
//     but when q.UntilFull (the reset is the time until the upstream's
//     quota is full again, as OpenAI and Anthropic say it), the quota
//     refills all along: the bucket is emptied and refills go on at the
//     configured rate at once. With q.Remaining above 0, q.Reset is not
//     used: x/time/rate refills continuously and has no way to let the
//     remaining tokens through while holding its refills back until the
//     reset, so refills go on at the configured rate; a refusal's
//     Retry-After then holds the Rate.
//   - Adapt: a Rate does not adapt its rate; s.Refused alone changes
//     nothing.
//
// A caller whose start was already due when Feedback came (its timer not
// yet fired) still starts: it is as good as granted.
func (r *Rate) Feedback(ctx context.Context, s upstream.Signal) error {
	var quotas []upstream.Quota
	for _, q := range s.Quotas {
		if q.Unit == "" {
			quotas = append(quotas, q)
		}
	}
	if s.RetryAfter <= 0 && len(quotas) == 0 {
		return nil
	}
	sched := r.q.sched.(*rateSchedule)
	r.q.retime(func(now time.Time) {
		for _, q := range quotas {
			reset := q.Reset
			if q.UntilFull {
				// The quota refills all along: its reset is when it is
				// full, not when refills resume.
				reset = 0
			}
			sched.sync(now, q.Remaining, reset)
		}
		if s.RetryAfter > 0 {
			sched.hold(now, now.Add(s.RetryAfter))
		}
	})
	return nil
}

// Waiting returns the number of callers waiting in Enter or EnterN right
// now.
func (r *Rate) Waiting() int {
	return r.q.waiting()
}

// Stats returns the Rate's figures (sluice.Stats): callers waiting now, and
// the results of its calls since NewRate, as its Observer was told them.
// It is safe for concurrent use.
func (r *Rate) Stats() sluice.Stats {
	return r.q.tally.Stats()
}

// rateSchedule books starts as x/time/rate reservations.
//
// floor is the end of the latest hold: nothing starts before it, and every
// call into lim is made at a time no earlier than it (at). x/time/rate
// counts time forward from its last call, so a call at an earlier time
// would credit the tokens of the stretch between twice.
type rateSchedule struct {
	lim   *rate.Limiter
	limit float64          // lim's limit in tokens per second
	last  rate.Reservation // the most recent booking, for unbook
	floor time.Time        // the end of the latest hold; zero before any
}

// at is the time the schedule works at: now, or the end of the hold.
func (s *rateSchedule) at(now time.Time) time.Time {
	if s.floor.After(now) {
		return s.floor
	}
	return now
}

func (s *rateSchedule) book(now time.Time, n int) time.Time {
	t := s.at(now)
	r := s.lim.ReserveN(t, n) // ok: the queue never books more than the burst
	s.last = *r
	return t.Add(r.DelayFrom(t))
}

func (s *rateSchedule) unbook(now time.Time) {
	s.last.CancelAt(s.at(now))
}

// estimate mirrors the arithmetic of rate.Limiter.ReserveN without reserving.
func (s *rateSchedule) estimate(now time.Time, k int) time.Time {
	t := s.at(now)
	tokens := s.lim.TokensAt(t) - float64(k)
	if tokens >= 0 {
		return t
	}
	d := (-tokens / s.limit) * float64(time.Second)
	if d > math.MaxInt64 {
		return t.Add(math.MaxInt64)
	}
	return t.Add(time.Duration(d))
}

// lower takes tokens at t (not before the floor) until at most level are
// left; it never adds any. The queue's front, if it holds a booking, must
// have been unbooked first (queue.retime), since unbook undoes the most
// recent reservation.
func (s *rateSchedule) lower(t time.Time, level float64) {
	t = s.at(t)
	k := math.Ceil(s.lim.TokensAt(t) - level)
	if k >= 1 {
		s.lim.ReserveN(t, int(k)) // k <= burst: the tokens never exceed it
	}
}

// hold empties the bucket now and lets nothing start before until. During
// a hold in force it only extends it: the bucket was emptied when that
// hold began.
func (s *rateSchedule) hold(now, until time.Time) {
	if !s.floor.After(now) {
		s.lower(now, 0)
	}
	if until.After(s.floor) {
		s.floor = until
	}
}

// sync brings the tokens down to at most remaining. With none remaining
// and a reset, the bucket is empty at the reset and nothing starts before
// it: refills resume then.
func (s *rateSchedule) sync(now time.Time, remaining int64, reset time.Duration) {
	if remaining > 0 || reset <= 0 {
		s.lower(now, float64(remaining))
		return
	}
	until := now.Add(reset)
	s.lower(until, 0)
	if until.After(s.floor) {
		s.floor = until
	}
}
