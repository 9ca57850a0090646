package local

import (
	"fmt"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/configerr"
)

// Refusals. Each wraps sluice.ErrLimited, and a refused call has consumed
// nothing: no token, no slot, no place in a queue.
var (
	// errQueueFull is returned by Rate when MaxQueue callers already
	// wait: sluice.ErrQueueFull.
	errQueueFull = configerr.Kind("local", sluice.ErrQueueFull)

	// errWaitTooLong is returned by Rate when the caller would wait longer
	// than MaxWait: sluice.ErrWaitTooLong.
	errWaitTooLong = configerr.Kind("local", sluice.ErrWaitTooLong)

	// ErrTimeout is returned by Concurrency when a slot did not free up
	// within AcquireTimeout, or, in Do, within RunTimeout. Do also sets it as
	// the cause (see context.Cause) of the context it passes to fn when
	// RunTimeout ends.
	ErrTimeout = configerr.Sentinel("local: timed out waiting for a slot", sluice.ErrLimited)
)

// errCostExceedsCapacity is wrapped by the refusal, at once and never
// queued, of a cost no wait could ever grant: one above the Rate's Burst or
// the Concurrency's Limit. The error names the cost and that bound, and
// matches sluice.ErrCostExceedsCapacity, not sluice.ErrLimited: retrying
// later cannot succeed.
var errCostExceedsCapacity = configerr.Kind("local", sluice.ErrCostExceedsCapacity)

// checkCost returns an error for a cost n that is negative, or above
// capacity, the limiter's field called name.
func checkCost(n int, name string, capacity int) error {
	if n < 0 {
		return negativeCost(n)
	}
	if n > capacity {
		return fmt.Errorf("%w: cost %d above the %s %d, so it could never be granted",
			errCostExceedsCapacity, n, name, capacity)
	}
	return nil
}

// errConfig is wrapped by every error a constructor returns; it matches
// sluice.ErrConfig.
var errConfig = configerr.New("local")

func invalid(format string, args ...any) error {
	return configerr.Invalid(errConfig, format, args...)
}

// negativeCost is the error for a negative cost: a bug in the caller, so
// neither a refusal nor a cost too large.
func negativeCost(n int) error {
	return fmt.Errorf("local: negative cost %d", n)
}
