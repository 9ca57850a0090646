package bucket

import (
	"context"
	"errors"
	"time"

	"github.com/sluicehq/sluice"
)

// tryKey marks the ctx of a TryEnter's call: the caller may wait for
// nothing (ownWait is 1 µs) and arrives with explicit costs (costsOf), so
// that it never takes the push lane, which queues before it weighs.
type tryKey struct{}

func trying(ctx context.Context) bool { return ctx.Value(tryKey{}) != nil }

// TryEnter takes a caller of cost c (nil: Enter's) only when its tokens
// are there now and nobody waits ahead of it, in any process: it then
// reports true, and the caller may start. Otherwise it takes nothing and
// never queues: it reports false with the Estimate of what Enter would
// wait now (the wait counts the callers queued ahead and their costs, as
// Estimate's). It is x/time/rate's Allow, and Reserve().Delay() when
// refused, in one round trip.
//
// Tries are not fair: a token goes to whoever asks first once it is
// there, not to who asked longest. In a trial of 12 processes trying 20
// times a second each on a quota of 100 a second, processes whose ticks
// fell just after the refills took 60 of their 60 tries, others 1 of 60.
// Callers that must share fairly wait their turn in Enter.
//
// ctx bounds the round trip only. Errors are Enter's, except that a wait
// is never one: a cost no policy can ever grant is
// sluice.ErrCostExceedsCapacity, a queue at MaxQueue sluice.ErrQueueFull
// (with false), and Redis's errors are Enter's. While Redis is
// unreachable with Config.Fallback LocalShare, the local share answers
// the same way. Observers see a refusal as Refused, "wait_too_long".
func (b *Bucket) TryEnter(ctx context.Context, c Cost) (bool, Estimate, error) {
	e, err := b.enter(context.WithValue(ctx, tryKey{}, true), c)
	var tooLong *sluice.WaitTooLongError
	switch {
	case err == nil:
		return true, Estimate{}, nil
	case errors.As(err, &tooLong):
		return false, Estimate{Wait: tooLong.Wait, Ahead: max(e.Position-1, 0)}, nil
	}
	return false, Estimate{}, err
}

// tryCosts are a TryEnter's costs when they are Enter's: each policy's
// call, explicit.
func (b *Bucket) tryCosts() []int64 {
	ps := b.inForce()
	costs := make([]int64, len(ps))
	for i, p := range ps {
		if p.Unit == "" {
			costs[i] = 1
		}
	}
	return costs
}

// tryWait is the longest a TryEnter's caller waits: a slot due later than
// this is not "now".
const tryWait = time.Microsecond
