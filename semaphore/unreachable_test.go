package semaphore

// When Redis is away and the caller has no deadline: Acquire fails within
// the documented bound, min(LeaseTTL, QueueTTL) (Acquire's doc), with an
// error naming the cause in words a person can act on.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testing/testkit"
)

// defaultBound is Acquire's bound with the default TTLs; hangMargin what
// a loaded CI machine under -race may add: these tests catch hangs, they
// do not time the bound.
const (
	defaultBound = 2 * time.Second
	hangMargin   = 2 * time.Second
)

// TestAcquireRedisDownFromStart: against a Redis that is down from the
// start, Acquire without a deadline fails within the bound and says why.
func TestAcquireRedisDownFromStart(t *testing.T) {
	e := newEnv(t)
	e.srv.RequireReal(t)
	s := e.sem(t, Config{Name: t.Name(), Capacity: 2})
	if err := e.srv.Kill(); err != nil {
		t.Fatal(err)
	}
	for _, what := range []string{"first Acquire", "second Acquire"} {
		start := time.Now()
		_, err := s.Acquire(context.Background())
		took := time.Since(start)
		t.Logf("%s returned after %v: %v", what, took.Round(time.Millisecond), err)
		if took > defaultBound+hangMargin {
			t.Errorf("%s returned after %v, want ≤ %v (the bound) + %v", what, took, defaultBound, hangMargin)
		}
		testkit.CheckUnreachable(t, "Acquire", err, e.srv.Addr(), testkit.Refused)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := s.Acquire(ctx)
	if took := time.Since(start); took > 300*time.Millisecond || err == nil {
		t.Errorf("Acquire on a 100ms deadline: %v after %v", err, took)
	}
}

// TestAcquireRedisGoneWhileWaiting: waiters queued without a deadline all
// return with an error within the bound once Redis is killed, or frozen
// (SIGSTOP).
func TestAcquireRedisGoneWhileWaiting(t *testing.T) {
	for _, fault := range []string{testkit.Killed, testkit.Frozen} {
		t.Run(fault, func(t *testing.T) {
			e := newEnv(t)
			e.srv.RequireReal(t)
			s := e.sem(t, Config{Name: t.Name(), Capacity: 1})
			acquire(t, s, time.Second) // held: everyone else queues
			const callers = 20
			goAway := e.srv.Kill
			if fault == testkit.Frozen {
				goAway = e.srv.Pause
				defer e.srv.Resume()
			}
			testkit.CallersAway{
				Op: "Acquire", Callers: callers, Fault: fault, Addr: e.srv.Addr(),
				Bound: defaultBound + hangMargin,
				Call: func() error {
					p, err := s.Acquire(context.Background())
					if p != nil {
						return errors.New("granted while the permit was held")
					}
					return err
				},
				Queued: func() bool { return queueLen(t, e.rdb, s) == callers },
				GoAway: goAway,
			}.Check(t)
		})
	}
}
