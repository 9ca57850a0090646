package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	sl "github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/enterdetail"
)

// sluice serve's bucket endpoints: enter, reserve, settle, cancel,
// estimate and the inspection (docs/sidecar.md, "The API").

// costRequest is the body of enter, reserve and estimate.
type costRequest struct {
	// Cost by unit; absent means one call ({"": 1}).
	Cost      bucket.Cost `json:"cost"`
	TimeoutMS int64       `json:"timeout_ms"`
}

func (c costRequest) cost() bucket.Cost {
	if c.Cost == nil {
		return bucket.Cost{"": 1}
	}
	return c.Cost
}

// grantReply is enter's and reserve's answer.
type grantReply struct {
	// Reservation is reserve's id, for settle and cancel.
	Reservation string  `json:"reservation,omitempty"`
	WaitedMS    float64 `json:"waited_ms"`
	// Ticket is the caller's arrival order at Redis among the bucket's
	// callers (bucket.Report.Ticket); 0 when it did not queue.
	Ticket int64 `json:"ticket"`
	// Detail is for cmd/bench only (envDetail).
	Detail *enterdetail.Wire `json:"detail,omitempty"` // what cmd/bench needs of a grant to judge it as it judges the library's
}

func (s *sidecar) enter(w http.ResponseWriter, r *http.Request)   { s.grant(w, r, false) }
func (s *sidecar) reserve(w http.ResponseWriter, r *http.Request) { s.grant(w, r, true) }

// grant is enter and reserve: the caller waits its turn in the bucket.
func (s *sidecar) grant(w http.ResponseWriter, r *http.Request, reserve bool) {
	var req costRequest
	if !decode(w, r, &req) {
		return
	}
	sb, ctx, d, leave, ok := waitIn(s, w, r, "bucket", req.TimeoutMS, s.bucketOf)
	if !ok {
		return
	}
	defer leave()
	name := r.PathValue("name")
	var detail enterdetail.Detail
	if s.opt.granted != nil || s.opt.detail {
		ctx = enterdetail.With(ctx, &detail)
	}
	cost := req.cost()
	if msg := badCost(ctx, sb.l, cost); msg != "" {
		fail(w, http.StatusBadRequest, "bucket %q: %s", name, msg)
		return
	}
	var (
		rep bucket.Report
		res *bucket.Reservation
		err error
	)
	if reserve {
		if res, err = sb.l.Reserve(ctx, cost); err == nil {
			rep = res.Report()
		}
	} else {
		rep, err = sb.l.EnterReport(ctx, cost)
	}
	if err != nil {
		s.refused(w, r, name, d, err)
		return
	}
	if reserve && r.Context().Err() != nil { // granted as the client left: nobody will settle it
		res.Cancel(context.WithoutCancel(ctx))
		return
	}
	if s.opt.granted != nil {
		s.opt.granted(name, detail, rep, cost)
	}
	out := grantReply{WaitedMS: float64(rep.Wait.Microseconds()) / 1000, Ticket: rep.Ticket}
	if s.opt.detail {
		out.Detail = &enterdetail.Wire{SlotUS: detail.Slot.UnixMicro(), Position: rep.Position, Polls: detail.Polls,
			Retimes: rep.Retimes, Reentries: rep.Reentries, LateNS: int64(rep.Late), Claims: detail.Claims}
	}
	if reserve {
		out.Reservation = newID()
		s.mu.Lock()
		s.reservations[out.Reservation] = &heldReservation{bucket: name, r: res, expires: time.Now().Add(sb.l.Config().ReservationTTL)}
		s.mu.Unlock()
	}
	reply(w, http.StatusOK, out)
}

// badCost says what is wrong with cost c for bucket b, or "" when
// nothing is. The library refuses such a cost too, but with an error no
// sentinel marks (it could not be told from Redis's), so the server
// checks first: a negative cost, or a unit no policy in force counts.
func badCost(ctx context.Context, b *bucket.Bucket, c bucket.Cost) string {
	counts := func(ps []bucket.Policy, unit string) bool {
		for _, p := range ps {
			if p.Unit == unit {
				return true
			}
		}
		return false
	}
	var inForce []bucket.Policy
	for unit, n := range c {
		if n < 0 {
			return fmt.Sprintf("negative cost %d of unit %q", n, unit)
		}
		if counts(b.Config().Policies, unit) {
			continue
		}
		if inForce == nil { // the policies may have changed since: ask Redis
			ps, err := b.Policies(ctx)
			if err != nil {
				return ""
			}
			inForce = ps
		}
		if !counts(inForce, unit) {
			return fmt.Sprintf("cost of unit %q, which no policy of the bucket counts", unit)
		}
	}
	return ""
}

// settleRequest is the body of settle and cancel.
type settleRequest struct {
	Reservation string `json:"reservation"`
	// Cost is settle's true cost; a unit it does not name is charged at
	// the estimate.
	Cost bucket.Cost `json:"cost"`
}

func (s *sidecar) settle(w http.ResponseWriter, r *http.Request) { s.finish(w, r, true) }
func (s *sidecar) cancel(w http.ResponseWriter, r *http.Request) { s.finish(w, r, false) }

// finish is settle and cancel.
func (s *sidecar) finish(w http.ResponseWriter, r *http.Request, settle bool) {
	var req settleRequest
	if !decode(w, r, &req) {
		return
	}
	name := r.PathValue("name")
	if req.Reservation == "" {
		fail(w, http.StatusBadRequest, "no reservation given (the id reserve answered)")
		return
	}
	s.mu.Lock()
	hr := s.reservations[req.Reservation]
	s.mu.Unlock()
	if hr == nil || hr.bucket != name {
		fail(w, http.StatusNotFound, "bucket %q: no open reservation %q (settled, cancelled, expired, or reserved from another server)", name, req.Reservation)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), callTimeout)
	defer cancel()
	s.mu.Lock()
	sb := s.buckets[name]
	s.mu.Unlock()
	if sb != nil {
		if msg := badCost(ctx, sb.l, req.Cost); msg != "" {
			fail(w, http.StatusBadRequest, "bucket %q: %s", name, msg)
			return
		}
	}
	var err error
	if settle {
		err = hr.r.Settle(ctx, req.Cost)
	} else {
		err = hr.r.Cancel(ctx)
	}
	switch {
	case err == nil || errors.Is(err, bucket.ErrReservationSettled):
		s.mu.Lock()
		delete(s.reservations, req.Reservation)
		s.mu.Unlock()
		if err != nil {
			fail(w, http.StatusConflict, "bucket %q: %v", name, err)
			return
		}
		reply(w, http.StatusOK, struct{}{})
	case errors.Is(err, sl.ErrConfig):
		fail(w, http.StatusBadRequest, "bucket %q: %v", name, err)
	default:
		fail(w, http.StatusServiceUnavailable, "bucket %q: %v (the reservation stays open: try again)", name, err)
	}
}

// estimateReply is estimate's answer.
type estimateReply struct {
	WaitMS float64 `json:"wait_ms"`
	Ahead  int     `json:"ahead"`
}

func (s *sidecar) estimate(w http.ResponseWriter, r *http.Request) {
	var req costRequest
	if !decode(w, r, &req) {
		return
	}
	sb := s.bucketOf(w, r)
	if sb == nil {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), callTimeout)
	defer cancel()
	if msg := badCost(ctx, sb.l, req.cost()); msg != "" {
		fail(w, http.StatusBadRequest, "bucket %q: %s", r.PathValue("name"), msg)
		return
	}
	est, err := sb.l.Estimate(ctx, req.cost())
	switch {
	case errors.Is(err, sl.ErrCostExceedsCapacity) || errors.Is(err, sl.ErrConfig):
		fail(w, http.StatusBadRequest, "%q: %v", r.PathValue("name"), err)
	case err != nil:
		s.failed(w, r, r.PathValue("name"), err)
	default:
		reply(w, http.StatusOK, estimateReply{WaitMS: float64(est.Wait.Microseconds()) / 1000, Ahead: est.Ahead})
	}
}

// inspectBucket answers as `sluice inspect --json`.
func (s *sidecar) inspectBucket(w http.ResponseWriter, r *http.Request) {
	sb := s.bucketOf(w, r)
	if sb == nil {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), callTimeout)
	defer cancel()
	in, err := sb.l.Inspect(ctx)
	if err != nil {
		s.failed(w, r, r.PathValue("name"), err)
		return
	}
	reply(w, http.StatusOK, newReport(r.PathValue("name"), s.opt.prefix, in))
}

// bucketOf returns the handle on the path's bucket: the one --config
// names, or else one that follows the policies Redis stores. It answers
// and returns nil when the name is invalid or the bucket unknown.
func (s *sidecar) bucketOf(w http.ResponseWriter, r *http.Request) *served[*bucket.Bucket] {
	return servedOf(s, w, r, "bucket", s.buckets, s.adoptBucket)
}

// adoptBucket opens a handle on bucket name that follows the policies
// Redis stores. They are read through a handle that stores nothing
// (Inspect only reads), then served as its own policies, so that the
// bucket's state expiring later stores them again, never a placeholder.
func (s *sidecar) adoptBucket(ctx context.Context, name string) (*bucket.Bucket, error) {
	probe, err := bucket.New(s.rdb, bucket.Config{Name: name, KeyPrefix: s.opt.prefix, Policies: placeholder, Adopt: true})
	if err != nil {
		return nil, answer(http.StatusBadRequest, "bucket %q: %v", name, err)
	}
	in, err := probe.Inspect(ctx)
	probe.Close()
	switch {
	case err != nil:
		return nil, err
	case !in.Stored:
		return nil, answer(http.StatusNotFound, "bucket %q: unknown: not in --config, and %s", name, noConfig)
	}
	b, err := bucket.New(s.rdb, bucket.Config{Name: name, KeyPrefix: s.opt.prefix, Policies: in.Policies, Adopt: true, Observer: s.observer})
	if err != nil {
		return nil, answer(http.StatusInternalServerError, "bucket %q: the policies stored: %v", name, err)
	}
	return b, nil
}
