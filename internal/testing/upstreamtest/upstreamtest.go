// Package upstreamtest is a strict upstream HTTP API for tests and
// benchmarks: a real net/http server on loopback that enforces token-bucket
// policies judged at each request's arrival, answers 429 with Retry-After
// in whole seconds rounded up (as most APIs do), and counts what it
// accepted and refused. Server limits requests; LLM limits requests and
// tokens as an LLM API does, and answers with the tokens used.
package upstreamtest

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"time"
)

// Policy is one limit: at most Burst requests at once, refilled at Rate per
// Period, as local.RateConfig's fields. Period 0 means one second, Burst 0
// means 1. With Window set, it is a rolling window instead: at most Rate
// requests arriving in any window of that length (a request at t counts
// until t + Window, excluded), as a strict API that keeps a log of its
// clients' requests; Period and Burst are then unused.
type Policy struct {
	Rate   int
	Period time.Duration
	Burst  int
	Window time.Duration
}

// Config configures a Server.
type Config struct {
	// Policies are the limits a request must pass, all of them; a request
	// refused by one takes from none.
	Policies []Policy
	// Remaining adds X-RateLimit-Limit and X-RateLimit-Remaining to every
	// answer: the burst and the whole requests left of the policy with the
	// fewest left, after this request.
	Remaining bool
}

// Arrival is one request as the server judged it.
type Arrival struct {
	At     time.Time // when the handler began to judge it
	Status int       // 200, 429, or 503 during an outage
}

// Stats counts the requests the server answered.
type Stats struct {
	Accepted int // answered 200
	Refused  int // answered 429 or 503
}

// Server is a running test upstream. Its methods are safe for concurrent
// use.
type Server struct {
	srv *httptest.Server

	mu       sync.Mutex
	policies []gcra
	remain   bool
	outage   time.Time // requests before it are refused with 503
	log      []Arrival
	stats    Stats
}

// gcra is a token bucket kept as a theoretical arrival time, in whole
// nanoseconds so that judging is exact: a request at t passes when
// max(tat, t) − t ≤ tau, and then tat = max(tat, t) + every.
type gcra struct {
	every time.Duration // Period / Rate
	tau   time.Duration // (Burst − 1) × every: how far ahead tat may run
	burst int
	tat   time.Time
	// A rolling window (Policy.Window) instead: the arrivals it accepted
	// within the last window, oldest first.
	window time.Duration
	limit  int
	times  []time.Time
}

// expire drops a rolling window's arrivals that no longer count at now.
func (p *gcra) expire(now time.Time) {
	n := 0
	for n < len(p.times) && !p.times[n].Add(p.window).After(now) {
		n++
	}
	p.times = p.times[n:]
}

// New starts a Server on a free loopback port. Close it when done.
func New(cfg Config) *Server {
	s := &Server{remain: cfg.Remaining}
	for _, p := range cfg.Policies {
		if p.Window > 0 {
			s.policies = append(s.policies, gcra{window: p.Window, limit: max(p.Rate, 1), burst: max(p.Rate, 1)})
			continue
		}
		period, burst := p.Period, max(p.Burst, 1)
		if period == 0 {
			period = time.Second
		}
		every := period / time.Duration(max(p.Rate, 1))
		s.policies = append(s.policies, gcra{every: every, tau: time.Duration(burst-1) * every, burst: burst})
	}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

// URL is the server's base URL, http://127.0.0.1:port.
func (s *Server) URL() string { return s.srv.URL }

// Close stops the server and waits for the requests in progress.
func (s *Server) Close() { s.srv.Close() }

// Outage refuses every request for the next d with 503 and a Retry-After
// of the outage's remaining time in whole seconds, rounded up. Refused
// requests take no token.
func (s *Server) Outage(d time.Duration) {
	s.mu.Lock()
	s.outage = time.Now().Add(d)
	s.mu.Unlock()
}

// Stats returns the counts so far.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stats
}

// Arrivals returns every request judged so far, in arrival order.
func (s *Server) Arrivals() []Arrival {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Arrival(nil), s.log...)
}

func (s *Server) serve(w http.ResponseWriter, r *http.Request) {
	status, wait, limit, left := s.judge(time.Now())
	if s.remain && limit > 0 {
		w.Header().Set("X-RateLimit-Limit", strconv.Itoa(limit))
		w.Header().Set("X-RateLimit-Remaining", strconv.Itoa(left))
	}
	if status != http.StatusOK {
		w.Header().Set("Retry-After", strconv.FormatInt(ceilSeconds(wait), 10))
	}
	w.WriteHeader(status)
}

// judge decides on a request arriving at now: its status, the wait to
// announce when refused, and the burst and remaining requests of the
// policy with the fewest left.
func (s *Server) judge(now time.Time) (status int, wait time.Duration, limit, left int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	status = http.StatusOK
	switch {
	case now.Before(s.outage):
		status, wait = http.StatusServiceUnavailable, s.outage.Sub(now)
	default:
		for i := range s.policies {
			p := &s.policies[i]
			if p.window > 0 {
				if p.expire(now); len(p.times) >= p.limit {
					status, wait = http.StatusTooManyRequests, max(wait, p.times[len(p.times)-p.limit].Add(p.window).Sub(now))
				}
				continue
			}
			if ahead := later(p.tat, now).Sub(now); ahead > p.tau {
				status, wait = http.StatusTooManyRequests, max(wait, ahead-p.tau)
			}
		}
		if status == http.StatusOK {
			for i := range s.policies {
				p := &s.policies[i]
				if p.window > 0 {
					p.times = append(p.times, now)
					continue
				}
				p.tat = later(p.tat, now).Add(p.every)
			}
		}
	}
	left = -1
	for _, p := range s.policies {
		if p.window > 0 {
			if n := p.limit - len(p.times); left < 0 || n < left {
				left, limit = max(n, 0), p.limit
			}
			continue
		}
		// Whole requests that would pass now: tat may run tau + every
		// ahead of now before the next one is refused.
		n := int((p.tau + p.every - later(p.tat, now).Sub(now)) / p.every)
		if left < 0 || n < left {
			left, limit = max(n, 0), p.burst
		}
	}
	s.log = append(s.log, Arrival{At: now, Status: status})
	if status == http.StatusOK {
		s.stats.Accepted++
	} else {
		s.stats.Refused++
	}
	return status, wait, limit, max(left, 0)
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// ceilSeconds is d in whole seconds, rounded up, at least 1.
func ceilSeconds(d time.Duration) int64 {
	return max(int64((d+time.Second-1)/time.Second), 1)
}
