package semaphore

import (
	"context"
	"errors"
	"fmt"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/configerr"
	"github.com/sluicehq/sluice/internal/rediscall"
)

// The capacity in force: reading and setting it, and refusing a weight
// above it.

// errCostExceedsCapacity is wrapped by the refusal of a weight above the
// capacity in force (sluice.ErrCostExceedsCapacity: AcquireN's doc).
var errCostExceedsCapacity = configerr.Kind("semaphore", sluice.ErrCostExceedsCapacity)

// tooHeavy is the refusal of a weight n above the capacity in force.
func (s *Semaphore) tooHeavy(n, capacity int) error {
	return fmt.Errorf("%w: weight %d above Capacity %d of semaphore %q, so it could never be granted",
		errCostExceedsCapacity, n, capacity, s.cfg.Name)
}

// loweredBelow is the refusal of a waiter of weight n after SetCapacity
// lowered the capacity below n.
func (s *Semaphore) loweredBelow(n int) error {
	return fmt.Errorf("%w: weight %d above the capacity of semaphore %q, lowered below it (SetCapacity) while it waited, so it could never be granted",
		errCostExceedsCapacity, n, s.cfg.Name)
}

// SetCapacity makes n the capacity in force, for every process using this
// semaphore at once: one script call stores it in Redis and applies it
// there. Processes that had acquired under the old capacity follow it
// from their next call; processes that start later with another
// Config.Capacity get sluice.ErrConfigMismatch unless they set Config.Adopt.
//
// Raising the capacity grants the waiters it makes room for in that same
// call and wakes them at once. Lowering it never revokes a permit: the
// weights already held stay held, and nobody is admitted until they fall
// below n. A waiter heavier than n could never be granted: it leaves the
// queue in that call (or the next that reaches it), and its AcquireN
// returns an error matching sluice.ErrCostExceedsCapacity; those behind it move
// up. SetCapacity works whether or not anyone holds or waits, and the
// capacity stays stored while the semaphore is used, and for a week
// after its last use.
//
// n must be at least 1 (else sluice.ErrConfig). It returns sluice.ErrClosed after Close,
// an error naming the format for state written by a newer version, and
// an error wrapping Redis's (matching ctx.Err() when ctx ended first) when
// Redis did not answer; the change may then have happened or not.
func (s *Semaphore) SetCapacity(ctx context.Context, n int) error {
	if n < 1 {
		return configerr.Invalid(errConfig, "capacity %d, want at least 1", n)
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return errClosed
	}
	done := make(chan error, 1)
	s.exchange(ctx, batch{set: &setOp{n: n, done: done}})
	err := <-done
	if err != nil && ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		return s.callError(err).WithCtx(ctx.Err())
	}
	return err
}

// Capacity returns the capacity in force: the one stored in Redis, or,
// when none is (nobody has used the semaphore for a week, or ever), the
// one this process would store at its next call: Config.Capacity, or the
// capacity it last followed. It returns an error naming the format for
// state written by a newer version, and an error wrapping Redis's when
// Redis did not answer.
func (s *Semaphore) Capacity(ctx context.Context) (int, error) {
	v, err := s.rdb.HMGet(ctx, s.keys[4], fieldFormat, fieldCapacity).Result()
	if err != nil {
		return 0, rediscall.RedisError(ctx, "semaphore", s.cfg.Name, s.rdb, err, 0)
	}
	if len(v) != 2 {
		return 0, fmt.Errorf("%w: HMGET of 2 fields returned %d", errReply, len(v))
	}
	n, ok, err := s.parseStored(v[0], v[1])
	if err != nil || ok {
		return n, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.capacity, nil
}

// logMismatch tells the Logger that Redis refused this process's
// capacity, once for each capacity in force it meets rather than once per
// call.
func (s *Semaphore) logMismatch(stored int64) {
	l := s.cfg.Logger
	if l == nil {
		return
	}
	s.mu.Lock()
	said := s.mismatchSaid == stored
	s.mismatchSaid = stored
	s.mu.Unlock()
	if !said {
		l.Warn("sluice: this process's semaphore Capacity differs from the one in force; refusing it (deploy one Capacity, call SetCapacity, or set Config.Adopt to follow)",
			"semaphore", s.cfg.Name, "mine", s.cfg.Capacity, "in_force", stored)
	}
}
