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
)

// ErrLimited is the parent of every refusal a limiter makes without waiting
// (a full queue, a wait longer than allowed, an acquire timeout). Test for it
// with errors.Is; each package's own sentinels wrap it.
var ErrLimited = errors.New("sluice: limited")

// ErrConfig is the parent of every package's ErrConfig (bucket.ErrConfig,
// semaphore.ErrConfig, local.ErrConfig): a constructor refused its
// configuration or its Redis client. It does not match ErrLimited: a bad
// configuration is a bug to fix, not a refusal to back off from.
var ErrConfig = errors.New("sluice: invalid config")

// ErrCostExceedsCapacity is the parent of every package's refusal of a cost
// that no wait could ever grant: one above a policy's capacity (or a
// semaphore's permits). It is returned at once, never queued, and does not
// match ErrLimited: retrying later cannot succeed.
var ErrCostExceedsCapacity = errors.New("sluice: cost exceeds capacity")

// ErrConfigMismatch is the parent of every package's refusal to run with a
// configuration that disagrees with the one in force in Redis (another
// process's, or one set by a live change): bucket.ErrConfigMismatch,
// semaphore.ErrConfigMismatch. The error names both configurations. It
// matches ErrConfig, not ErrLimited: two processes disagreeing on a limit
// is a deployment to fix (or a live change to adopt), not a refusal to back
// off from.
var ErrConfigMismatch = fmt.Errorf("sluice: config differs from the one in force: %w", ErrConfig)

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
