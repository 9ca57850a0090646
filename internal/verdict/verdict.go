// Package verdict turns what a limiter's call returned into an Event's
// Result and Reason, and tallies the Events into Stats, the same way for
// every limiter.
package verdict

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/rediscall"
)

// Reason names why a call failed or was refused, for an Event (the
// sluice.Event Reason values). Each limiter passes its own sentinels in
// named, checked first; then come the ones every package shares.
type Reason struct {
	Err    error
	Result sluice.Result
	Name   string
}

// Classify turns the error a call to enter returned (err, with its ctx)
// into an Event's Result and Reason: named lists a package's own errors,
// checked in order before the shared ones.
func Classify(ctx context.Context, err error, named ...Reason) (sluice.Result, string) {
	if err == nil {
		return sluice.Granted, ""
	}
	for _, r := range named {
		if errors.Is(err, r.Err) {
			return r.Result, r.Name
		}
	}
	switch {
	case errors.Is(err, sluice.ErrCostExceedsCapacity):
		return sluice.Refused, "cost_exceeds_capacity"
	case errors.Is(err, sluice.ErrLimited):
		return sluice.Refused, "limited"
	case ctx.Err() != nil && errors.Is(err, ctx.Err()):
		return sluice.Canceled, ""
	case errors.Is(err, sluice.ErrConfigMismatch):
		return sluice.Failed, "config_mismatch"
	case errors.Is(err, sluice.ErrConfig):
		return sluice.Failed, "config"
	}
	var call *rediscall.CallError
	if errors.As(err, &call) {
		return sluice.Failed, "redis"
	}
	return sluice.Failed, "error" // a bad argument, or Redis's error without the package's wrapping
}

// Tally counts a limiter's calls for its Stats and reports each one to
// its Observer: Begin when a call starts waiting, End when it returns. The
// zero value (with Limiter and Name set) is ready; it is safe for
// concurrent use.
type Tally struct {
	Limiter, Name string
	Observer      sluice.Observer // nil: none

	waiting                             atomic.Int64
	granted, refused, canceled, failed  atomic.Int64
	reentries                           atomic.Int64
	local                               atomic.Int64
	shadow, shadowRefused, shadowFailed atomic.Int64
	shadowWait                          atomic.Int64 // ns
}

// Begin counts a call that starts.
func (t *Tally) Begin() { t.waiting.Add(1) }

// Waiting is how many calls have begun and not ended.
func (t *Tally) Waiting() int64 { return t.waiting.Load() }

// End counts the call's result and reports it to the Observer.
func (t *Tally) End(e sluice.Event) {
	t.waiting.Add(-1)
	switch e.Result {
	case sluice.Granted:
		t.granted.Add(1)
		if e.Local {
			t.local.Add(1)
		}
	case sluice.Refused:
		t.refused.Add(1)
	case sluice.Canceled:
		t.canceled.Add(1)
	default:
		t.failed.Add(1)
	}
	if e.Reentries > 0 {
		t.reentries.Add(int64(e.Reentries))
	}
	if t.Observer != nil {
		e.Limiter, e.Name = t.Limiter, t.Name
		t.Observer.Observe(e)
	}
}

// Shadow counts a call a limiter in shadow mode let through, e being
// what it would have done (e.Shadow set), and reports it to the Observer.
func (t *Tally) Shadow(e sluice.Event) {
	t.shadow.Add(1)
	switch e.Result {
	case sluice.Granted:
		t.shadowWait.Add(int64(e.Wait))
	case sluice.Refused:
		t.shadowRefused.Add(1)
	default:
		t.shadowFailed.Add(1)
	}
	if t.Observer != nil {
		e.Limiter, e.Name, e.Shadow = t.Limiter, t.Name, true
		t.Observer.Observe(e)
	}
}

// Stats returns the counts (the fields of sluice.Stats a Tally keeps).
func (t *Tally) Stats() sluice.Stats {
	return sluice.Stats{
		Waiting:      t.waiting.Load(),
		Granted:      t.granted.Load(),
		LocalGranted: t.local.Load(),
		Refused:      t.refused.Load(),
		Canceled:     t.canceled.Load(),
		Failed:       t.failed.Load(),
		Reentries:    t.reentries.Load(),

		Shadow:        t.shadow.Load(),
		ShadowRefused: t.shadowRefused.Load(),
		ShadowFailed:  t.shadowFailed.Load(),
		ShadowWait:    time.Duration(t.shadowWait.Load()),
	}
}
