package local

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/sluicehq/sluice"
)

var (
	_ sluice.Limiter     = (*Concurrency)(nil)
	_ sluice.StatsReader = (*Concurrency)(nil)
)

// ConcurrencyConfig configures a Concurrency. Only Limit is required.
type ConcurrencyConfig struct {
	// Limit is the number of calls allowed to run at once, at least 1.
	Limit int

	// AcquireTimeout refuses a caller with ErrTimeout when its slots (n of
	// them for AcquireN) do not free up within this time. Zero means wait
	// until ctx ends.
	AcquireTimeout time.Duration

	// RunTimeout bounds a whole Do, wait plus work: Do returns ErrTimeout if
	// the wait alone uses it up, and fn's context ends when it runs out
	// (with ErrTimeout as its context.Cause). fn must watch its context;
	// Do does not abandon fn. Zero means no bound. Acquire ignores it.
	RunTimeout time.Duration

	// Observer, when set, is told of every Acquire, AcquireN and Do's
	// entry once it returns, as a sluice.Event of Limiter
	// "local.concurrency": the metrics packages implement it. It runs on
	// the caller's goroutine. nil costs nothing.
	Observer sluice.Observer
}

// Concurrency lets at most Limit calls run at once, first come first served.
// Use Do, or pair every successful Acquire with one Release.
//
// The zero value is not usable; create one with NewConcurrency. A Concurrency
// is safe for concurrent use.
type Concurrency struct {
	sem            *semaphore.Weighted
	limit          int
	acquireTimeout time.Duration
	runTimeout     time.Duration
	tally          tally // the calls, for Stats and the Observer

	// The slots held, for Stats: an uncontended Acquire without an
	// Observer (quick) pays one atomic add rather than the tally's four,
	// which would double its cost; its Release pays another.
	quick    atomic.Int64 // grants of one slot on arrival, not in the tally
	taken    atomic.Int64 // slots taken by the other grants
	released atomic.Int64 // slots released
}

// NewConcurrency returns a Concurrency configured by cfg, or an error
// wrapping sluice.ErrConfig if cfg is out of range.
func NewConcurrency(cfg ConcurrencyConfig) (*Concurrency, error) {
	switch {
	case cfg.Limit < 1:
		return nil, invalid("Limit is %d, must be at least 1", cfg.Limit)
	case cfg.AcquireTimeout < 0:
		return nil, invalid("AcquireTimeout is %v, must not be negative", cfg.AcquireTimeout)
	case cfg.RunTimeout < 0:
		return nil, invalid("RunTimeout is %v, must not be negative", cfg.RunTimeout)
	}
	return &Concurrency{
		sem:            semaphore.NewWeighted(int64(cfg.Limit)),
		limit:          cfg.Limit,
		acquireTimeout: cfg.AcquireTimeout,
		runTimeout:     cfg.RunTimeout,
		tally:          newTally("local.concurrency", cfg.Observer),
	}, nil
}

// Acquire takes a slot, waiting for one if all are in use. It returns
// ErrTimeout if AcquireTimeout passes first, and ctx.Err() if ctx ends first;
// in both cases nothing is held and Release must not be called.
func (c *Concurrency) Acquire(ctx context.Context) error {
	return c.acquire(ctx, 1)
}

// AcquireN is Acquire for a caller that takes n slots at once, as
// semaphore.Weighted's Acquire; release them with ReleaseN(n). Callers wait
// in arrival order whatever their cost: a large n at the front waits until
// n slots are free and the callers behind it wait too, never overtaking it.
// A caller that gives up holds nothing.
//
// n = 0 returns at once: nil, or ctx.Err() if ctx has already ended. An n
// above Limit could never be granted (semaphore.Weighted would block until
// ctx ends) and is refused at once with an error matching
// sluice.ErrCostExceedsCapacity (not sluice.ErrLimited); a negative n is an error
// (a bug in the caller, which the Observer is not told of).
func (c *Concurrency) AcquireN(ctx context.Context, n int) error {
	if err := checkCost(n, "Limit", c.limit); err != nil {
		if n < 0 {
			return err
		}
		return c.tally.once(ctx, err)
	}
	if n == 0 {
		// semaphore.Weighted would queue a zero cost behind the waiters.
		return c.tally.once(ctx, ctx.Err())
	}
	return c.acquire(ctx, int64(n))
}

// acquire takes n >= 1 slots and reports the call to the tally.
func (c *Concurrency) acquire(ctx context.Context, n int64) error {
	if n == 1 && c.tally.Observer == nil && ctx.Err() == nil && c.sem.TryAcquire(1) {
		c.quick.Add(1)
		return nil
	}
	start := c.tally.begin()
	queued, err := c.take(ctx, n)
	if err == nil {
		c.taken.Add(n)
	}
	c.tally.end(ctx, start, err, queued, time.Time{})
	return err
}

// take is acquire's wait; queued says the slots were not free on arrival.
func (c *Concurrency) take(ctx context.Context, n int64) (queued bool, _ error) {
	if err := ctx.Err(); err != nil {
		return false, err
	}
	// TryAcquire respects the queue, so this fast path keeps FIFO order and
	// spares the uncontended caller the timeout context.
	if c.sem.TryAcquire(n) {
		return false, nil
	}
	return true, c.acquireSlow(ctx, n)
}

func (c *Concurrency) acquireSlow(ctx context.Context, n int64) error {
	actx := ctx
	if c.acquireTimeout > 0 {
		var cancel context.CancelFunc
		actx, cancel = context.WithTimeoutCause(ctx, c.acquireTimeout, ErrTimeout)
		defer cancel()
	}
	err := c.sem.Acquire(actx, n)
	if err == nil {
		return nil
	}
	// The cause tells our own timeouts (AcquireTimeout, or RunTimeout when
	// called from Do) from the caller's context ending.
	if errors.Is(context.Cause(actx), ErrTimeout) {
		return ErrTimeout
	}
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	return err
}

// Release gives back a slot taken by Acquire. Like semaphore.Weighted, it
// panics if more slots are released than were acquired.
func (c *Concurrency) Release() {
	c.sem.Release(1)
	c.released.Add(1)
}

// ReleaseN gives back n slots taken by AcquireN (or by n calls of Acquire).
// It panics if n is negative or if more slots are released than were
// acquired: both are bugs in the caller.
func (c *Concurrency) ReleaseN(n int) {
	if n < 0 {
		panic("local: ReleaseN of a negative count")
	}
	c.sem.Release(int64(n))
	c.released.Add(int64(n))
}

// Stats returns the Concurrency's figures (sluice.Stats): callers waiting
// now, the slots held now (Held), and the results of its calls since
// NewConcurrency, as its Observer was told them. It is safe for concurrent
// use.
func (c *Concurrency) Stats() sluice.Stats {
	// Releases first: every one counted follows a grant counted below, so
	// Held is never negative.
	released := c.released.Load()
	s := c.tally.Stats()
	quick := c.quick.Load()
	s.Granted += quick
	s.Held = quick + c.taken.Load() - released
	return s
}

// Do takes a slot, runs fn, and releases the slot when fn returns or panics.
// It returns Acquire's error without running fn if no slot was taken, and
// fn's error otherwise. With RunTimeout set, fn gets a context that ends
// when RunTimeout has passed since Do was called.
func (c *Concurrency) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	if c.runTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, c.runTimeout, ErrTimeout)
		defer cancel()
	}
	if err := c.Acquire(ctx); err != nil {
		return err
	}
	defer c.Release()
	return fn(ctx)
}
