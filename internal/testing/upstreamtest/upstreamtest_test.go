package upstreamtest

import (
	"net/http"
	"strconv"
	"testing"
	"time"
)

// The judging is exact on fake instants: 2 per second with a burst of 3.
func TestJudge(t *testing.T) {
	s := &Server{remain: true, policies: []gcra{{every: 500 * time.Millisecond, tau: time.Second, burst: 3}}}
	t0 := time.Unix(1000, 0)
	steps := []struct {
		at         time.Duration
		status     int
		wait       time.Duration
		limit, rem int
	}{
		{0, 200, 0, 3, 2},
		{0, 200, 0, 3, 1},
		{0, 200, 0, 3, 0},
		{0, 429, 500 * time.Millisecond, 3, 0},
		{499 * time.Millisecond, 429, time.Millisecond, 3, 0},
		{500 * time.Millisecond, 200, 0, 3, 0},
		{2 * time.Second, 200, 0, 3, 2},
	}
	for i, st := range steps {
		status, wait, limit, rem := s.judge(t0.Add(st.at))
		if status != st.status || wait != st.wait || limit != st.limit || rem != st.rem {
			t.Errorf("step %d at %v: got %d wait %v limit %d left %d, want %d wait %v limit %d left %d",
				i, st.at, status, wait, limit, rem, st.status, st.wait, st.limit, st.rem)
		}
	}
	if got := s.Stats(); got != (Stats{Accepted: 5, Refused: 2}) {
		t.Errorf("stats %+v", got)
	}
	if n := len(s.Arrivals()); n != len(steps) {
		t.Errorf("%d arrivals logged, want %d", n, len(steps))
	}
}

// A rolling window of 3 per second, on fake instants: a request counts
// until a second after it, excluded, and a refusal names when the oldest
// one leaves.
func TestJudgeRolling(t *testing.T) {
	s := New(Config{Policies: []Policy{{Rate: 3, Window: time.Second}}, Remaining: true})
	defer s.Close()
	t0 := time.Unix(1000, 0)
	steps := []struct {
		at         time.Duration
		status     int
		wait       time.Duration
		limit, rem int
	}{
		{0, 200, 0, 3, 2},
		{100 * time.Millisecond, 200, 0, 3, 1},
		{200 * time.Millisecond, 200, 0, 3, 0},
		{999 * time.Millisecond, 429, time.Millisecond, 3, 0},
		{time.Second, 200, 0, 3, 0},
		{1099 * time.Millisecond, 429, time.Millisecond, 3, 0},
		{1100 * time.Millisecond, 200, 0, 3, 0},
		{3 * time.Second, 200, 0, 3, 2},
	}
	for i, st := range steps {
		status, wait, limit, rem := s.judge(t0.Add(st.at))
		if status != st.status || wait != st.wait || limit != st.limit || rem != st.rem {
			t.Errorf("step %d at %v: got %d wait %v limit %d left %d, want %d wait %v limit %d left %d",
				i, st.at, status, wait, limit, rem, st.status, st.wait, st.limit, st.rem)
		}
	}
}

// Over HTTP: the burst passes, the next is refused with Retry-After in
// whole seconds rounded up, and an outage answers 503.
func TestServer(t *testing.T) {
	s := New(Config{Policies: []Policy{{Rate: 1, Period: time.Hour, Burst: 2}}, Remaining: true})
	defer s.Close()
	get := func() *http.Response {
		t.Helper()
		resp, err := http.Get(s.URL())
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	for i, want := range []int{200, 200, 429} {
		r := get()
		if r.StatusCode != want {
			t.Fatalf("request %d: %d, want %d", i, r.StatusCode, want)
		}
		if want == 429 {
			ra, _ := strconv.Atoi(r.Header.Get("Retry-After"))
			if ra < 3599 || ra > 3600 {
				t.Errorf("Retry-After %q, want about an hour in whole seconds", r.Header.Get("Retry-After"))
			}
		}
		if got := r.Header.Get("X-RateLimit-Remaining"); got != strconv.Itoa(max(1-i, 0)) {
			t.Errorf("request %d: X-RateLimit-Remaining %q", i, got)
		}
	}
	s.Outage(1500 * time.Millisecond)
	r := get()
	if r.StatusCode != 503 || r.Header.Get("Retry-After") != "2" {
		t.Errorf("during an outage: %d, Retry-After %q; want 503, 2", r.StatusCode, r.Header.Get("Retry-After"))
	}
	if got := s.Stats(); got != (Stats{Accepted: 2, Refused: 2}) {
		t.Errorf("stats %+v", got)
	}
}
