package bucket

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
)

// ErrReservationSettled: Settle or Cancel of a reservation that was
// already settled or cancelled, that another call is settling, or whose
// Config.ReservationTTL has passed. Nothing was changed.
var ErrReservationSettled = errors.New("bucket: reservation already settled")

// Reservation is a grant whose true cost is known only once the work is
// done, such as an LLM call whose output tokens the response tells:
// Reserve took its estimate, and Settle charges what the work really
// cost (or Cancel gives it all back). It is safe for concurrent use; only
// the first Settle or Cancel that succeeds counts.
//
// Nothing of an open reservation is kept in Redis: its estimate was taken
// when it was granted. A reservation never settled (its process died, or
// the code forgot) stays counted at its estimate, and after
// Config.ReservationTTL it can no longer be settled.
type Reservation struct {
	b        *Bucket
	estimate Cost      // nil: Enter's cost
	expires  time.Time // local clock
	report   Report
	slot     time.Time // on the Redis clock; zero: unknown

	mu    sync.Mutex
	state string // "" open; else why it no longer is
}

// Reserve waits like EnterCost for a caller of estimated cost c (nil:
// Enter's cost) and returns its reservation once the caller may start.
// Unlike x/time/rate's Reserve, it waits: a Reservation is a grant, and
// the work may start at once. Settle it with the true cost when the work
// is done, or Cancel it if the work never reached the upstream. Errors
// are EnterCost's, and so is its bound: a ctx deadline shorter than the
// estimated wait refuses it at once with a *sluice.WaitTooLongError that
// carries the estimate, taking nothing (see Enter), so each call bounds
// its own wait.
//
// Estimate high: a settle below the estimate gives the rest back to the
// callers queued, while one above it is a debt the callers after it wait
// out, after the upstream may already have seen the excess (see
// docs/guarantees.md, "Settling").
func (b *Bucket) Reserve(ctx context.Context, c Cost) (*Reservation, error) {
	e, err := b.enter(ctx, c)
	if err != nil {
		return nil, err
	}
	return &Reservation{b: b, estimate: maps.Clone(c), expires: b.now().Add(b.cfg.ReservationTTL), report: e.Report, slot: e.Slot}, nil
}

// Estimate is the cost the reservation was granted with (nil: Enter's).
func (r *Reservation) Estimate() Cost { return maps.Clone(r.estimate) }

// Report tells what the wait for the reservation did, as EnterReport's.
func (r *Reservation) Report() Report { return r.report }

// Settle charges the work's true cost: for every unit actual names, the
// difference from the estimate goes back to the bucket at once when the
// work cost less (the callers at the head of the queue have it first; a
// full bucket keeps no more than its Capacity), or is taken as a debt
// when it cost more (the callers after it wait it out; this call does
// not wait). A unit missing from actual is charged at its estimate:
// Settle(ctx, Cost{"tokens": 812}) leaves the call counted. Every policy
// is corrected at once, in one round trip.
//
// A negative cost or a unit no policy counts is an error before anything
// is charged. A reservation settles once: a second Settle, a Settle after
// Cancel, one while another call is settling it, or one past
// Config.ReservationTTL returns an error matching ErrReservationSettled.
// When the call to Redis fails, the reservation stays open and counted
// at its estimate: Settle may be tried again.
func (r *Reservation) Settle(ctx context.Context, actual Cost) error {
	for unit, n := range actual {
		if n < 0 {
			return fmt.Errorf("bucket: Settle with a negative cost %d of unit %s", n, unitName(unit))
		}
	}
	return r.close(ctx, "settled", actual)
}

// Cancel gives the whole estimate back to the bucket, as a Settle with a
// cost of zero in every unit: the work never reached the upstream (it was
// not sent, or the upstream refused it without counting it). Its errors
// are Settle's.
func (r *Reservation) Cancel(ctx context.Context) error {
	zero := Cost{}
	for _, p := range r.b.inForce() {
		zero[p.Unit] = 0
	}
	return r.close(ctx, "cancelled", zero)
}

// close settles r at actual, why naming what it did.
func (r *Reservation) close(ctx context.Context, why string, actual Cost) error {
	if err := r.claim(); err != nil {
		return err
	}
	var slot int64
	if !r.slot.IsZero() {
		slot = r.slot.UnixMicro()
	}
	err := r.b.settle(ctx, slot, r.estimate, actual)
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		r.state = "" // open again: counted at its estimate until settled
		return err
	}
	r.state = why
	return nil
}

// claim marks r as being settled, or says why it cannot be.
func (r *Reservation) claim() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.state != "":
		return fmt.Errorf("%w: it was %s", ErrReservationSettled, r.state)
	case r.b.now().After(r.expires):
		r.state = fmt.Sprintf("granted more than ReservationTTL (%v) ago and counts at its estimate", r.b.cfg.ReservationTTL)
		return fmt.Errorf("%w: it was %s", ErrReservationSettled, r.state)
	}
	r.state = "being settled by another call"
	return nil
}

// settle charges every policy in force the difference between actual and
// estimate (units missing from actual keep their estimate), following the
// policies in force as every call does.
func (b *Bucket) settle(ctx context.Context, slot int64, estimate, actual Cost) error {
	for settled := 0; ; settled++ {
		id, qps := b.runsUnder()
		ps := fromQueue(qps)
		for unit, n := range actual {
			if n > 0 && !slices.ContainsFunc(ps, func(p Policy) bool { return p.Unit == unit }) {
				return fmt.Errorf("bucket: Settle of unit %s, which no policy of bucket %q counts", unitName(unit), b.cfg.Name)
			}
		}
		diffs := make([]int64, len(ps))
		changes := false
		for i, p := range ps {
			est := estimate[p.Unit]
			if estimate == nil && p.Unit == "" {
				est = 1 // Enter's cost
			}
			if n, ok := actual[p.Unit]; ok {
				diffs[i] = int64(n - est)
				changes = changes || n != est
			}
		}
		if !changes {
			return nil
		}
		err := b.q.Settle(ctx, id, slot, diffs)
		retry, serr := b.followInForce(ctx, err, settled)
		switch {
		case retry:
			continue
		case serr != nil:
			return serr
		case err != nil:
			return b.redisErr(ctx, err)
		}
		return nil
	}
}
