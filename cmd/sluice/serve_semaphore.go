package main

import (
	"context"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/semaphore"
)

// sluice serve's semaphore endpoints: acquire, renew, release and the
// inspection.

// acquireRequest is acquire's body.
type acquireRequest struct {
	// Weight of the permit; 0 means 1.
	Weight    int   `json:"weight"`
	TimeoutMS int64 `json:"timeout_ms"`
}

// permitReply is acquire's and renew's answer: the permit stays held
// while its client renews it within LeaseMS.
type permitReply struct {
	Permit   string  `json:"permit"`
	LeaseMS  int64   `json:"lease_ms"`
	WaitedMS float64 `json:"waited_ms,omitempty"`
}

func (s *sidecar) acquire(w http.ResponseWriter, r *http.Request) {
	var req acquireRequest
	if !decode(w, r, &req) {
		return
	}
	if req.Weight < 0 {
		fail(w, http.StatusBadRequest, "weight %d, want ≥ 1 (0 means 1)", req.Weight)
		return
	}
	ss, ctx, d, leave, ok := waitIn(s, w, r, "semaphore", req.TimeoutMS, s.semaphoreOf)
	if !ok {
		return
	}
	defer leave()
	name := r.PathValue("name")
	start := time.Now()
	p, err := ss.l.AcquireN(ctx, max(req.Weight, 1))
	if err != nil {
		s.refused(w, r, name, d, err)
		return
	}
	if r.Context().Err() != nil { // granted as the client left
		p.Release(context.Background())
		return
	}
	id := newID()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		p.Release(context.Background())
		fail(w, http.StatusServiceUnavailable, "%q: the server is shutting down", name)
		return
	}
	s.permits[id] = &heldPermit{semaphore: name, p: p, expires: time.Now().Add(s.opt.lease)}
	s.mu.Unlock()
	reply(w, http.StatusOK, permitReply{Permit: id, LeaseMS: s.opt.lease.Milliseconds(), WaitedMS: float64(time.Since(start).Microseconds()) / 1000})
}

// permitRequest is the body of renew and release.
type permitRequest struct {
	Permit string `json:"permit"`
}

// heldPermitOf returns the permit the body names, or answers 404.
func (s *sidecar) heldPermitOf(w http.ResponseWriter, r *http.Request) (string, *heldPermit) {
	var req permitRequest
	if !decode(w, r, &req) {
		return "", nil
	}
	name := r.PathValue("name")
	if req.Permit == "" {
		fail(w, http.StatusBadRequest, "no permit given (the id acquire answered)")
		return "", nil
	}
	s.mu.Lock()
	hp := s.permits[req.Permit]
	s.mu.Unlock()
	if hp == nil || hp.semaphore != name {
		fail(w, http.StatusNotFound, "semaphore %q: no permit %q held (released, or not renewed within its lease)", name, req.Permit)
		return "", nil
	}
	return req.Permit, hp
}

func (s *sidecar) renew(w http.ResponseWriter, r *http.Request) {
	id, hp := s.heldPermitOf(w, r)
	if hp == nil {
		return
	}
	select {
	case <-hp.p.Lost():
		s.mu.Lock()
		delete(s.permits, id)
		s.mu.Unlock()
		fail(w, http.StatusGone, "semaphore %q: %v: another caller may hold the place now", hp.semaphore, semaphore.ErrLeaseLost)
		return
	default:
	}
	s.mu.Lock()
	hp.expires = time.Now().Add(s.opt.lease)
	s.mu.Unlock()
	reply(w, http.StatusOK, permitReply{Permit: id, LeaseMS: s.opt.lease.Milliseconds()})
}

func (s *sidecar) release(w http.ResponseWriter, r *http.Request) {
	id, hp := s.heldPermitOf(w, r)
	if hp == nil {
		return
	}
	s.mu.Lock()
	_, held := s.permits[id]
	delete(s.permits, id)
	s.mu.Unlock()
	if !held { // another release took it first
		fail(w, http.StatusNotFound, "semaphore %q: no permit %q held (released)", hp.semaphore, id)
		return
	}
	if err := hp.p.Release(r.Context()); err != nil {
		fail(w, http.StatusGone, "semaphore %q: %v", hp.semaphore, err)
		return
	}
	reply(w, http.StatusOK, struct{}{})
}

// semaphoreReport is GET /v1/semaphores/{name}.
type semaphoreReport struct {
	Semaphore string    `json:"semaphore"`
	Prefix    string    `json:"prefix"`
	Now       time.Time `json:"now"`
	Capacity  int       `json:"capacity"`
	Held      int       `json:"held"`
	Holders   int       `json:"holders"`
	Queued    int       `json:"queued"`
	Expired   int       `json:"expired"`
}

func (s *sidecar) inspectSemaphore(w http.ResponseWriter, r *http.Request) {
	ss := s.semaphoreOf(w, r)
	if ss == nil {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), callTimeout)
	defer cancel()
	in, err := ss.l.Inspect(ctx)
	if err != nil {
		s.failed(w, r, r.PathValue("name"), err)
		return
	}
	reply(w, http.StatusOK, semaphoreReport{
		Semaphore: r.PathValue("name"), Prefix: s.opt.prefix, Now: in.Now.UTC(),
		Capacity: in.Capacity, Held: in.Held, Holders: in.Holders, Queued: in.Queued, Expired: in.Expired,
	})
}

// semaphoreOf is bucketOf for semaphores.
func (s *sidecar) semaphoreOf(w http.ResponseWriter, r *http.Request) *served[*semaphore.Semaphore] {
	return servedOf(s, w, r, "semaphore", s.semaphores, s.adoptSemaphore)
}

// adoptSemaphore opens a handle on semaphore name that follows the
// capacity Redis stores, read as adoptBucket reads a bucket's policies.
func (s *sidecar) adoptSemaphore(ctx context.Context, name string) (*semaphore.Semaphore, error) {
	probe, err := semaphore.New(s.rdb, semaphore.Config{Name: name, KeyPrefix: s.opt.prefix, Capacity: 1, Adopt: true})
	if err != nil {
		return nil, answer(http.StatusBadRequest, "semaphore %q: %v", name, err)
	}
	in, err := probe.Inspect(ctx)
	probe.Close()
	switch {
	case err != nil:
		return nil, err
	case !in.Stored:
		return nil, answer(http.StatusNotFound, "semaphore %q: unknown: not in --config, and no capacity stored: it was never used, or idle for a week", name)
	}
	sem, err := semaphore.New(s.rdb, semaphore.Config{Name: name, KeyPrefix: s.opt.prefix, Capacity: in.Capacity, Adopt: true, Observer: s.observer})
	if err != nil {
		return nil, answer(http.StatusInternalServerError, "semaphore %q: the capacity stored: %v", name, err)
	}
	return sem, nil
}
