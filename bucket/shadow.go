// Shadow mode (Config.Shadow): calls return at once, and what the
// limiter would have done is learned from Redis in the background.

package bucket

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/background"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/queue"
)

// ShadowReport is what a bucket in shadow mode would have done with a
// call (Report.Shadow).
type ShadowReport struct {
	// Wait is the wait the call would have had (0: none), unless Refused.
	Wait time.Duration
	// Refused: the limiter would have refused the call at once (its ctx's
	// deadline or MaxWait shorter than Wait, then the estimate).
	Refused bool
}

// shadowAhead is the lookahead of a shadow's queue: every caller is
// given its slot on arrival, however far (about 31 years), so none ever
// queues and the slot told is the wait.
const shadowAhead = 1 << 50 * time.Nanosecond

// shadowMaxPending bounds the shadow calls waiting to be sent (Redis
// slow or away): past it, a call is counted as failed, unsent.
const shadowMaxPending = 100_000

// shadowPrefix is the key prefix of a bucket of cfg: its own, or for a
// shadow, its own followed by ":shadow", so that the shadow's state lives
// apart from the bucket's.
func shadowPrefix(cfg Config) string {
	if cfg.Shadow {
		return cfg.KeyPrefix + ":shadow"
	}
	return cfg.KeyPrefix
}

// shadowLookahead is the queue's lookahead for a bucket of cfg.
func shadowLookahead(cfg Config) time.Duration {
	if cfg.Shadow {
		return shadowAhead
	}
	return cfg.Lookahead
}

// shadowCall is one call of a bucket in shadow mode on its way to Redis.
type shadowCall struct {
	id    string
	costs []int64
	wait  time.Duration     // the longest it may wait (mayWait); 0: no bound
	done  chan ShadowReport // nil: nobody waits for the outcome
}

// shadow sends a shadow bucket's calls to Redis in batches, in the
// background, and records what each would have met.
type shadow struct {
	b       *Bucket
	calls   *background.Batcher[*shadowCall]
	pending atomic.Int64
}

// newShadow returns b's shadow, or nil unless b is in shadow mode.
func newShadow(b *Bucket) *shadow {
	if !b.cfg.Shadow {
		return nil
	}
	s := &shadow{b: b}
	s.calls = background.NewBatcher(b.bg, background.BatcherConfig[*shadowCall]{Send: s.send, Max: maxBatch, Timeout: b.answerWithin()})
	return s
}

// enter lets a caller of cost c (nil: Enter's) through at once, or fails
// it when c is invalid; its arrival goes to Redis in the background.
// With report, it waits for Redis's answer and returns it.
func (s *shadow) enter(ctx context.Context, c Cost, report bool) (entered, error) {
	select {
	case <-s.b.bg.Done():
		return entered{}, errClosed
	default:
	}
	costs, stop, err := s.b.costsOf(ctx, c)
	if stop {
		return entered{}, err
	}
	if costs == nil {
		costs = s.b.tryCosts() // explicit: never the push lane, which queues
	}
	if s.pending.Add(1) > shadowMaxPending {
		s.pending.Add(-1)
		s.b.tally.Shadow(sluice.Event{Result: sluice.Failed, Reason: "redis"})
		return entered{}, nil
	}
	call := &shadowCall{id: s.b.newID(), costs: costs, wait: s.b.mayWait(s.b.ownWait(ctx))}
	if report {
		call.done = make(chan ShadowReport, 1)
	}
	s.calls.Add(call)
	if !report {
		return entered{}, nil
	}
	var rep entered
	select {
	case rep.Shadow = <-call.done:
	case <-ctx.Done():
	case <-s.b.bg.Done():
	}
	return rep, nil
}

// send is the batcher's: one arrival for the batch, every caller bound by
// its own wait, and each outcome recorded.
func (s *shadow) send(ctx context.Context, calls []*shadowCall) {
	defer s.pending.Add(-int64(len(calls)))
	ids := make([]string, len(calls))
	costs := make([][]int64, len(calls))
	waits := make([]time.Duration, len(calls))
	for i, c := range calls {
		ids[i], costs[i], waits[i] = c.id, c.costs, c.wait
	}
	replies, err := s.b.q.Enqueue(ctx, ids, costs, waits)
	for i, c := range calls {
		e := sluice.Event{Result: sluice.Failed, Reason: "redis"}
		if err == nil {
			e = s.outcome(replies[i])
		}
		if errors.As(err, new(*queueio.ConfigError)) {
			e.Reason = "config_mismatch"
		}
		s.b.tally.Shadow(e)
		if c.done != nil {
			c.done <- ShadowReport{Wait: e.Wait, Refused: e.Result == sluice.Refused}
		}
	}
}

// outcome is what the limiter would have done with a caller told r.
func (s *shadow) outcome(r queueio.Arrival) sluice.Event {
	switch {
	case errors.Is(r.Err, queueio.ErrWaitTooLong):
		return sluice.Event{Result: sluice.Refused, Reason: "wait_too_long", Wait: r.Delay}
	case r.Err != nil:
		return sluice.Event{Result: sluice.Refused, Reason: "queue_full"}
	case r.Entry != "":
		// Queued after all (a process not in shadow mode shares this
		// shadow's keys): it leaves, and its estimate is the wait.
		s.b.comings.leave(queue.Leaver{Entry: r.Entry})
	}
	return sluice.Event{Result: sluice.Granted, Wait: max(r.Delay, 0), Queued: r.Delay > 0}
}
