// Package sluice is the shared vocabulary of every limiter in this module:
// the distributed ones backed by Redis (packages bucket and semaphore) and the
// in-process ones (package local). Code that only needs "run this within the
// limit" depends on the Limiter interface and can swap one limiter for another,
// or for local.Noop in tests, without touching its call sites.
//
// This package imports nothing else from the module, so every limiter package
// can import it.
package sluice

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ErrLimited is the parent of every refusal a limiter makes without waiting
// (a full queue, a wait longer than allowed, an acquire timeout). Test for it
// with errors.Is; each package's own sentinels wrap it.
var ErrLimited = errors.New("sluice: limited")

// ErrQueueFull is every limiter's refusal of a caller because its
// MaxQueue callers already wait (bucket, semaphore, local Rate). It wraps
// ErrLimited; the error returned names the limiter and how many wait.
var ErrQueueFull error = &sentinel{"sluice: queue full", ErrLimited}

// ErrWaitTooLong is every limiter's refusal of a caller whose estimated
// wait is longer than its MaxWait (bucket, local Rate). It wraps
// ErrLimited; the error returned names the estimate.
var ErrWaitTooLong error = &sentinel{"sluice: wait too long", ErrLimited}

// WaitTooLongError is the refusal of a caller that cannot be served in
// time: the earliest it could start (Wait from the refusal, a lower bound
// while the callers ahead of it stay) is after its ctx's deadline
// (Deadline) or beyond the limiter's MaxWait. The caller took no place and
// no token. Read it with errors.As; it matches ErrWaitTooLong and
// ErrLimited, and context.DeadlineExceeded when its deadline was the
// bound, as x/time/rate's Wait refuses at once a wait its ctx's deadline
// cannot cover.
type WaitTooLongError struct {
	Limiter, Name string        // "bucket" and its Config.Name
	Wait          time.Duration // the estimated wait until its turn
	Limit         time.Duration // what it could wait: until its deadline, or MaxWait
	Deadline      bool          // Limit was the ctx's deadline, not MaxWait
	// Err is the limiter's own refusal, which wraps ErrWaitTooLong.
	Err error
}

func (e *WaitTooLongError) Error() string {
	bound := "MaxWait"
	if e.Deadline {
		bound = "its deadline"
	}
	return fmt.Sprintf("%s %q: wait too long: estimated %v, %s in %v", e.Limiter, e.Name, e.Wait.Round(time.Microsecond), bound, e.Limit.Round(time.Microsecond))
}

// Unwrap returns the limiter's refusal, and context.DeadlineExceeded when
// the bound was the ctx's deadline.
func (e *WaitTooLongError) Unwrap() []error {
	err := e.Err
	if err == nil {
		err = ErrWaitTooLong
	}
	if e.Deadline {
		return []error{err, context.DeadlineExceeded}
	}
	return []error{err}
}

// ErrClosed is what a bucket's or a semaphore's calls return after its
// Close, including those that were waiting when Close came.
var ErrClosed = errors.New("sluice: closed")

// ErrConfig is matched by every error a constructor of bucket, semaphore,
// local or transport returns when it refuses its configuration or its
// Redis client, and by a bucket's refusal of a cost it cannot read (a
// negative one, or one in a unit no policy counts); the message names the package and what is wrong ("bucket:
// invalid config: Capacity 0, want ≥ 1"). It does not match ErrLimited: a bad
// configuration is a bug to fix, not a refusal to back off from.
var ErrConfig = errors.New("sluice: invalid config")

// ErrCostExceedsCapacity matches every limiter's refusal of a cost that no
// wait could ever grant: one above a bucket policy's Capacity, a
// semaphore's Capacity, or a local Rate's Burst or Concurrency's Limit. The
// error is returned at once, never queued, and names the cost and the
// bound. It does not match ErrLimited: retrying later cannot succeed.
var ErrCostExceedsCapacity = errors.New("sluice: cost exceeds capacity")

// ErrConfigMismatch matches every refusal to run with a configuration that
// disagrees with the one in force in Redis (another process's, or one set
// by a live change), by a bucket or a semaphore. The error returned is a
// *ConfigMismatchError, which names both configurations. It matches
// ErrConfig, not ErrLimited: two processes disagreeing on a limit is a
// deployment to fix (or a live change to adopt), not a refusal to back off
// from.
var ErrConfigMismatch error = &sentinel{"sluice: config differs from the one in force", ErrConfig}

// ConfigMismatchError is the error a bucket or a semaphore returns when
// this process's configuration is not the one in force in Redis and it
// may not follow it (its Config.Adopt is false). Read it with errors.As;
// it matches ErrConfigMismatch and ErrConfig with errors.Is. The
// configurations are in the words the message uses; for the values, the
// caller has its own Config, and Bucket.Policies or Semaphore.Capacity read
// the ones in force.
type ConfigMismatchError struct {
	// Limiter is the kind of limiter that refused: "bucket" or "semaphore".
	Limiter string
	// Name is the limiter's Config.Name.
	Name string
	// Mine is this process's configuration and InForce the one in force in
	// Redis: a bucket's policies, such as "[100 calls, 10 every 1s]", or a
	// semaphore's capacity, such as "capacity 5".
	Mine, InForce string
}

func (e *ConfigMismatchError) Error() string {
	return fmt.Sprintf("%s %q: config differs from the one in force: this process has %s, Redis has %s",
		e.Limiter, e.Name, e.Mine, e.InForce)
}

// Unwrap returns ErrConfigMismatch, so that errors.Is matches it and
// ErrConfig.
func (e *ConfigMismatchError) Unwrap() error { return ErrConfigMismatch }

// sentinel is an error with its own message that also matches a parent:
// "sluice: queue full", not "queue full: sluice: limited". Each limiter's
// own sentinels follow it (internal/configerr.Kind): "bucket: queue full".
type sentinel struct {
	msg    string
	parent error
}

func (e *sentinel) Error() string { return e.msg }
func (e *sentinel) Unwrap() error { return e.parent }

// Limiter runs functions within a limit. Do waits for the caller's turn, runs
// fn, and for concurrency limiters releases the place after fn returns (even
// when fn panics). Do returns the limiter's error if it could not enter (an
// error matching ctx.Err() when ctx ended first), or else fn's error.
// Implementations are safe for concurrent use.
type Limiter interface {
	Do(ctx context.Context, fn func(ctx context.Context) error) error
}

// RateLimiter is a Limiter that limits how often work starts. Enter returns
// when the caller may start one unit of work; nothing needs to be released.
type RateLimiter interface {
	Limiter
	Enter(ctx context.Context) error
}
