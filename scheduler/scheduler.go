// Package scheduler gives waiting callers their slots: the step script
// (lua/step.lua, run by step.go) pops callers in arrival order, computes
// each one's slot from the bucket's policies and writes it; the loop here
// runs steps while callers wait. It is one of the token bucket's building
// blocks, with package queue, and exports only what package bucket uses:
// most users need only package bucket.
//
// Any process may run the loop; a short-lived Redis lock (github.com/bsm/redislock)
// elects one at a time, so usually one loop works per bucket. Each turn of
// the loop is one atomic step, fenced by the lock's token: a loop whose
// lock has expired (its process stalled) is refused and stops. The bucket's
// state lives in Redis, never here, so the rate holds even when two loops
// overlap; the lock only saves work. When the queue is empty the step itself
// releases the lock and the loop ends.
//
// The loop is not a goroutine of its own: every bucket on one Redis client
// has its steps run by that client's shared loop (internal/hub), so a
// process scheduling a thousand buckets runs a handful of goroutines. A
// process keeps the lock only while it has callers of its own queued on
// the bucket (New's waiting) and hands it over when it has none, or when
// it closes, by telling the bucket's other processes on its wake channel:
// a short-lived process that exits leaves no lock for the queue to wait
// out.
package scheduler

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/hub"
	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/queue"
)

// Scheduler runs the steps of one bucket's scheduler in this process, on
// the shared loop of its Redis client, while this process holds the lock.
// The zero value is not usable; call New. It is safe for concurrent use.
type Scheduler struct {
	rdb     redis.UniversalClient
	q       *queue.Queue
	opt     queueio.Options // q's at New; a step takes the policies in force from q.Run, not from here
	hub     *hub.Hub
	job     *hub.Job
	locker  *redislock.Client
	lockTTL time.Duration
	minRest time.Duration // shortest pause between steps, to batch callers

	waiting func() bool // nil: keep the lock while callers wait anywhere

	mu     sync.Mutex
	closed bool

	// Touched only by the job's run, which never runs twice at once.
	lock    *redislock.Lock
	lastOK  time.Time
	backoff time.Duration

	steps  atomic.Int64
	fenced atomic.Int64
	errs   atomic.Int64
}

// New returns a Scheduler for q, on the same Redis. q's LockTTL bounds how
// long callers wait for a new scheduler when this one's process dies; the
// loop rests at least half of q's Lookahead between steps, to batch
// callers. New starts nothing and does no I/O; Close must be called.
//
// waiting, when not nil, makes s keep the lock only while it reports that
// this process has callers queued on the bucket: with none, s releases the
// lock and tells the bucket's other processes (their callers then start a
// scheduler), so that a process about to exit holds no lock; call Ensure
// when waiting turns false, so that s hands over at once. With a nil
// waiting, s keeps the lock while callers wait in any process.
func New(rdb redis.UniversalClient, q *queue.Queue, waiting func() bool) *Scheduler {
	o := q.Options()
	s := &Scheduler{
		rdb:     rdb,
		q:       q,
		opt:     o,
		hub:     hub.Acquire(rdb),
		lockTTL: o.LockTTL,
		minRest: o.Lookahead / 2,
		waiting: waiting,
	}
	s.locker = redislock.New(s.hub.Pipelining())
	s.job = s.hub.NewJob(s.run)
	return s
}

// Ensure makes sure this process tries to run the scheduler: its next step
// (or its try to take the lock) runs at once. It never blocks.
func (s *Scheduler) Ensure() { s.job.Schedule(0) }

// Stats returns s's counters since New: the steps run, the steps refused
// because the lock was not ours (fenced), and the steps or lock requests
// that failed. It is safe to call at any time.
func (s *Scheduler) Stats() (steps, fenced, errs int64) {
	return s.steps.Load(), s.fenced.Load(), s.errs.Load()
}

// Close stops s, waits for a step in flight, and hands the lock over if it
// held it: it releases it and tells the bucket's other processes, whose
// callers start a scheduler at once rather than after the lock's TTL.
// Later Ensure calls do nothing. Close is safe to call more than once.
func (s *Scheduler) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	s.mu.Unlock()
	s.job.Stop()
	if s.lock != nil {
		ctx, cancel := context.WithTimeout(context.Background(), s.lockTTL)
		s.handOver(ctx)
		cancel()
	}
	s.hub.Release()
}

// handOver runs a last step, which schedules the callers due within the
// lookahead and releases the lock in one script, then tells the bucket's
// processes that the lock is free.
func (s *Scheduler) handOver(ctx context.Context) {
	lock := s.lock
	s.lock = nil
	r, err := lastStep(ctx, s.q, s.opt, lock.Token()+lock.Metadata())
	switch {
	case err != nil:
		// Redis is away or slow: release it plainly, if it answers.
		if lock.Release(ctx) != nil {
			return
		}
	case r.status == fenced:
		return // not ours any more: another process took it
	case r.waiting == 0:
		s.steps.Add(1)
		return // nobody waits: nobody needs telling
	default:
		s.steps.Add(1)
	}
	_ = s.rdb.Publish(ctx, s.opt.Keys.Wake, protocol.HandoverNotice).Err()
}

// run is one turn of the job: take the lock if this process does not hold
// it, then one step. It returns when to run again.
func (s *Scheduler) run(ctx context.Context) (time.Duration, bool) {
	if s.waiting != nil && !s.waiting() {
		if s.lock != nil {
			s.handOver(ctx)
		}
		return 0, false
	}
	if s.lock == nil && !s.obtain(ctx) {
		return 0, false
	}
	r, err := runStep(ctx, s.q, s.opt, s.lock.Token()+s.lock.Metadata(), s.lockTTL.Milliseconds(), s.lookahead())
	if err != nil {
		if ctx.Err() != nil {
			return 0, false
		}
		s.errs.Add(1)
		// Redis is unreachable or slow. Past the lock's TTL the lock is
		// surely gone; fencing would refuse us anyway.
		if time.Since(s.lastOK) > s.lockTTL {
			s.lock = nil
			return 0, false
		}
		d := s.backoff
		s.backoff = min(2*s.backoff, s.lockTTL/4)
		return d, true
	}
	s.steps.Add(1)
	s.lastOK, s.backoff = time.Now(), time.Millisecond
	switch r.status {
	case fenced:
		s.lock = nil
		s.fenced.Add(1)
		if l := s.opt.Logger; l != nil {
			l.Info("sluice: scheduler fenced: another process took the lock (this one was too slow to renew it, or a live change released it)", "lock", s.opt.Keys.Lock)
		}
		return 0, false
	case released:
		s.lock = nil
		return 0, false
	}
	rest := r.next
	if r.next > 0 || r.scheduled == 0 {
		// Batch: let a few slots come into the lookahead at once, but
		// step often enough to renew the lock.
		rest = max(rest, s.minRest)
	}
	return min(rest, s.lockTTL/3), true
}

// obtain takes the lock, and reports whether it did.
func (s *Scheduler) obtain(ctx context.Context) bool {
	octx, cancel := context.WithTimeout(ctx, s.lockTTL)
	lock, err := s.locker.Obtain(octx, s.opt.Keys.Lock, s.lockTTL, &redislock.Options{Metadata: protocol.LockMetadata})
	cancel()
	if err != nil {
		if !errors.Is(err, redislock.ErrNotObtained) && ctx.Err() == nil {
			s.errs.Add(1)
		}
		return false
	}
	s.lock, s.lastOK, s.backoff = lock, time.Now(), time.Millisecond
	return true
}

// lookahead is how far ahead this step gives slots: the queue's
// Lookahead. (Growing it with this process's own lateness was tried: a
// step that looks further than the queue reaches empties it and releases
// the lock, and a starved process of 100 buckets then held fewer than 90
// of their locks, bucket/TestSchedulerDiesWithManyBuckets; see
// docs/design.md, "Overload".)
func (s *Scheduler) lookahead() time.Duration {
	return s.opt.Lookahead
}
