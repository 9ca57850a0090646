// Package scheduler gives waiting callers their slots: the step script
// (lua/step.lua, run by step.go) pops callers in arrival order, computes
// each one's slot from the bucket's policies and writes it; the loop here
// runs steps while callers wait. It is one of the token bucket's building
// blocks, with package queue: most users need only package bucket.
//
// Any process may run the loop; a short-lived Redis lock (github.com/bsm/redislock)
// elects one at a time, so usually one loop works per bucket. Each turn of
// the loop is one atomic step, fenced by the lock's token: a loop whose
// lock has expired (its process stalled) is refused and stops. The bucket's
// state lives in Redis, never here, so the rate holds even when two loops
// overlap; the lock only saves work. When the queue is empty the step itself
// releases the lock and the loop ends.
package scheduler

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/queue"
)

// Scheduler starts and owns at most one scheduler goroutine of one bucket in
// this process. The zero value is not usable; call New. It is safe for
// concurrent use.
type Scheduler struct {
	rdb     redis.Scripter
	q       *queue.Queue
	locker  *redislock.Client
	lockTTL time.Duration
	minRest time.Duration // shortest pause between steps, to batch callers

	ctx    context.Context // ends at Close; owned here, never passed in
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex
	running bool // a goroutine is live
	kicked  bool // someone asked for a scheduler while it was live
	closed  bool

	steps  atomic.Int64
	fenced atomic.Int64
	errs   atomic.Int64
}

// holder names this process in the lock's value, after the token (a
// redislock Metadata): " <host>:<pid>", so that an operator can tell which
// process runs a bucket's scheduler (bucket.Inspect).
var holder = func() string {
	h, err := os.Hostname()
	if err != nil {
		h = "?"
	}
	return " " + h + ":" + strconv.Itoa(os.Getpid())
}()

// Holder reads the process a lock's value names (see holder): "" when it
// names none.
func Holder(lockValue string) string {
	_, h, _ := strings.Cut(lockValue, " ")
	return h
}

// New returns a Scheduler for q, on the same Redis. q's LockTTL bounds how
// long callers wait for a new scheduler when this one's process dies; the
// loop rests at least half of q's Lookahead between steps, to batch
// callers. New starts nothing and does no I/O.
func New(rdb redis.UniversalClient, q *queue.Queue) *Scheduler {
	ctx, cancel := context.WithCancel(context.Background())
	o := q.Options()
	return &Scheduler{
		rdb:     rdb,
		q:       q,
		locker:  redislock.New(rdb),
		lockTTL: o.LockTTL,
		minRest: o.Lookahead / 2,
		ctx:     ctx,
		cancel:  cancel,
	}
}

// Ensure makes sure this process tries to run the scheduler: it starts the
// goroutine unless one is live, in which case that one tries again to take
// the lock before it ends. It never blocks.
func (s *Scheduler) Ensure() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return
	}
	if s.running {
		s.kicked = true
		return
	}
	s.running = true
	s.wg.Add(1)
	go s.run()
}

// isRunning reports whether this process's scheduler goroutine is live.
func (s *Scheduler) isRunning() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running
}

// Stats are counters of one Scheduler since New.
type Stats struct {
	Steps  int64 // steps run
	Fenced int64 // steps refused because the lock was not ours
	Errors int64 // steps or lock requests that failed
}

// Stats returns the counters. It is safe to call at any time.
func (s *Scheduler) Stats() Stats {
	return Stats{Steps: s.steps.Load(), Fenced: s.fenced.Load(), Errors: s.errs.Load()}
}

// Close stops the goroutine, waits for it, and releases the lock if it held
// it. Later Ensure calls do nothing. Close is safe to call more than once.
func (s *Scheduler) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
}

// run takes the lock and steps until the queue is empty, the lock is lost,
// or Close; then it ends unless Ensure was called meanwhile.
func (s *Scheduler) run() {
	defer s.wg.Done()
	for {
		s.lead()
		if s.finish() {
			return
		}
	}
}

// finish decides under the mutex whether the goroutine ends; a kick since
// the last attempt means a caller may have found no lock: try once more.
func (s *Scheduler) finish() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.kicked && !s.closed {
		s.kicked = false
		return false
	}
	s.running = false
	return true
}

// lead takes the lock, if free, and runs steps while it holds it.
func (s *Scheduler) lead() {
	s.mu.Lock()
	s.kicked = false
	s.mu.Unlock()
	lock, err := s.locker.Obtain(s.ctx, s.q.Keys().Lock, s.lockTTL, &redislock.Options{Metadata: holder})
	if err != nil {
		if !errors.Is(err, redislock.ErrNotObtained) {
			s.errs.Add(1)
		}
		return
	}
	defer func() {
		if s.ctx.Err() != nil {
			// Close: hand the lock over at once rather than after its TTL.
			ctx, cancel := context.WithTimeout(context.Background(), s.lockTTL)
			defer cancel()
			_ = lock.Release(ctx)
		}
	}()
	lastOK := time.Now()
	backoff := time.Millisecond
	for {
		r, err := step(s.ctx, s.rdb, s.q, lock.Token()+lock.Metadata())
		if err != nil {
			if s.ctx.Err() != nil {
				return
			}
			s.errs.Add(1)
			// Redis is unreachable or slow. Past the lock's TTL the lock is
			// surely gone; fencing would refuse us anyway.
			if time.Since(lastOK) > s.lockTTL {
				return
			}
			if !s.rest(backoff) {
				return
			}
			backoff = min(2*backoff, s.lockTTL/4)
			continue
		}
		s.steps.Add(1)
		lastOK, backoff = time.Now(), time.Millisecond
		switch r.status {
		case fenced:
			s.fenced.Add(1)
			if l := s.q.Options().Logger; l != nil {
				l.Info("sluice: scheduler fenced: another process took the lock (this one was too slow to renew it, or a live change released it)", "lock", s.q.Keys().Lock)
			}
			return
		case released:
			return
		}
		rest := r.next
		if r.next > 0 || r.scheduled == 0 {
			// Batch: let a few slots come into the lookahead at once, but
			// step often enough to renew the lock.
			rest = max(rest, s.minRest)
		}
		rest = min(rest, s.lockTTL/3)
		if rest > 0 && !s.rest(rest) {
			return
		}
	}
}

// rest sleeps d or until Close; it reports false on Close.
func (s *Scheduler) rest(d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-s.ctx.Done():
		return false
	}
}
