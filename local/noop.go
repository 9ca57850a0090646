package local

import (
	"context"

	"github.com/sluicehq/sluice"
)

var (
	_ sluice.RateLimiter = Noop{}
	_ sluice.Limiter     = Noop{}
	_ sluice.StatsReader = Noop{}
)

// Noop is a limiter that never waits and never refuses. It has the limiting
// methods of Rate, Spacer and Concurrency (Enter, EnterN, Acquire,
// AcquireN, Release, ReleaseN, Do, Stats; not Rate's Waiting), so it can
// stand in for any of them to turn limiting off. It still reports a context that has
// already ended, so a loop that relies on Enter to notice cancellation keeps
// working.
//
// The zero value is ready to use. Noop is safe for concurrent use.
type Noop struct{}

// Enter returns ctx.Err(): nil unless ctx has already ended.
func (Noop) Enter(ctx context.Context) error {
	return ctx.Err()
}

// Acquire returns ctx.Err(): nil unless ctx has already ended.
func (Noop) Acquire(ctx context.Context) error {
	return ctx.Err()
}

// Release does nothing.
func (Noop) Release() {}

// EnterN returns ctx.Err() for any n >= 0, and an error for a negative n,
// as Rate.EnterN does. No cost is too large: a Noop has no burst.
func (Noop) EnterN(ctx context.Context, n int) error {
	if n < 0 {
		return negativeCost(n)
	}
	return ctx.Err()
}

// AcquireN returns ctx.Err() for any n >= 0, and an error for a negative n,
// as Concurrency.AcquireN does. No cost is too large: a Noop has no limit.
func (n Noop) AcquireN(ctx context.Context, cost int) error { return n.EnterN(ctx, cost) }

// ReleaseN does nothing. Unlike Concurrency.ReleaseN it does not panic,
// since a Noop keeps no count to check against.
func (Noop) ReleaseN(int) {}

// Stats returns zero figures: a Noop counts nothing (and has no Observer),
// so that it can stand in for a limiter read as a sluice.StatsReader too.
func (Noop) Stats() sluice.Stats { return sluice.Stats{} }

// Do runs fn with ctx and returns its error, or returns ctx.Err() without
// running fn if ctx has already ended.
func (Noop) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	return fn(ctx)
}
