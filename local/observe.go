package local

import (
	"context"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/verdict"
)

// reasons are local's refusals as Events name them; the shared ones
// (sluice.ErrCostExceedsCapacity, a ctx's) are verdict.Classify's.
var reasons = []verdict.Reason{
	{Err: errQueueFull, Result: sluice.Refused, Name: "queue_full"},
	{Err: errWaitTooLong, Result: sluice.Refused, Name: "wait_too_long"},
	{Err: ErrTimeout, Result: sluice.Refused, Name: "timeout"},
}

// tally counts one limiter's calls for its Stats and tells its Observer.
type tally struct {
	verdict.Tally
}

func newTally(limiter string, o sluice.Observer) tally {
	return tally{verdict.Tally{Limiter: limiter, Observer: o}}
}

// once reports a call decided on arrival, without waiting: a cost that
// could never be granted, or none. It returns err.
func (t *tally) once(ctx context.Context, err error) error {
	t.end(ctx, t.begin(), err, false, time.Time{})
	return err
}

// begin counts a call that starts and returns its start on a monotonic
// clock, read only when an Observer will be told (0 otherwise: no clock
// read).
func (t *tally) begin() time.Duration {
	t.Begin()
	if t.Observer == nil {
		return 0
	}
	return time.Since(epoch)
}

// epoch starts the monotonic clock of begin and end: time.Since reads only
// the monotonic clock, at half time.Now's cost.
var epoch = time.Now()

// end counts the call begun at start that returned err. queued says it
// was not let through on arrival; slot is the start it was booked for
// (zero when none), from which its lateness is counted.
func (t *tally) end(ctx context.Context, start time.Duration, err error, queued bool, slot time.Time) {
	res, why := verdict.Classify(ctx, err, reasons...)
	e := sluice.Event{Result: res, Reason: why, Queued: queued}
	if t.Observer != nil {
		e.Wait = time.Since(epoch) - start
		if err == nil && !slot.IsZero() {
			e.Late = max(0, -time.Until(slot))
		}
	}
	t.End(e)
}
