package local

import (
	"errors"
	"fmt"

	"github.com/sluicehq/sluice"
)

// Refusals. Each wraps sluice.ErrLimited, and a refused call has consumed
// nothing: no token, no slot, no place in a queue.
var (
	// ErrQueueFull is returned by Rate when MaxQueue callers already wait.
	ErrQueueFull = fmt.Errorf("local: queue full: %w", sluice.ErrLimited)

	// ErrWaitTooLong is returned by Rate when the caller would wait longer
	// than MaxWait.
	ErrWaitTooLong = fmt.Errorf("local: wait too long: %w", sluice.ErrLimited)

	// ErrTimeout is returned by Concurrency when a slot did not free up
	// within AcquireTimeout, or, in Do, within RunTimeout. Do also sets it as
	// the cause (see context.Cause) of the context it passes to fn when
	// RunTimeout ends.
	ErrTimeout = fmt.Errorf("local: timed out waiting for a slot: %w", sluice.ErrLimited)
)

// ErrInvalidConfig is wrapped by every error a constructor returns. It does
// not wrap sluice.ErrLimited: a bad configuration is a bug to fix, not a
// refusal to back off from.
var ErrInvalidConfig = errors.New("local: invalid config")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidConfig}, args...)...)
}
