package upstreamtest

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"time"
)

// NewOpenAI starts a Server on a free loopback port that judges as New's
// does but answers in OpenAI's words (upstream.OpenAI reads them): on
// every answer x-ratelimit-limit-requests (the burst),
// x-ratelimit-remaining-requests (the whole requests left) and
// x-ratelimit-reset-requests (the time until full again at the rate, a
// Go duration in whole milliseconds rounded up, as "195ms"), all of the
// policy with the fewest requests left; on a refusal retry-after in whole
// seconds rounded up. Of a token bucket they say its rate: (limit −
// remaining) ÷ reset. cfg.Remaining is not used. Close it when done.
func NewOpenAI(cfg Config) *Server {
	s := New(Config{Policies: cfg.Policies})
	// Judged as New's Server, answered in OpenAI's words instead: the
	// server New started has served nobody.
	s.srv.Close()
	s.srv = httptest.NewServer(http.HandlerFunc(s.serveOpenAI))
	return s
}

func (s *Server) serveOpenAI(w http.ResponseWriter, r *http.Request) {
	now := time.Now()
	status, wait, _, _ := s.judge(now)
	if limit, left, full := s.untilFull(now); limit > 0 {
		h := w.Header()
		h.Set("x-ratelimit-limit-requests", strconv.Itoa(limit))
		h.Set("x-ratelimit-remaining-requests", strconv.Itoa(left))
		h.Set("x-ratelimit-reset-requests", ((full + time.Millisecond - 1) / time.Millisecond * time.Millisecond).String())
	}
	if status != http.StatusOK {
		w.Header().Set("retry-after", strconv.FormatInt(ceilSeconds(wait), 10))
	}
	w.WriteHeader(status)
}

// untilFull is the burst, the whole requests left and the time until full
// of the policy with the fewest requests left at now.
func (s *Server) untilFull(now time.Time) (limit, left int, full time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	left = -1
	for _, p := range s.policies {
		var n int
		var ahead time.Duration
		if p.window > 0 {
			// A rolling window is full again when the last arrival it
			// counts leaves it.
			n = p.limit
			for _, at := range p.times {
				if leaves := at.Add(p.window); leaves.After(now) {
					n, ahead = n-1, leaves.Sub(now)
				}
			}
			n = max(n, 0)
		} else {
			ahead = later(p.tat, now).Sub(now)
			n = max(int((p.tau+p.every-ahead)/p.every), 0)
		}
		if left < 0 || n < left {
			limit, left, full = p.burst, n, ahead
		}
	}
	return limit, max(left, 0), full
}
