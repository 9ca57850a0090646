package transport

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/upstream"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// millis reads Retry-After in milliseconds, so that the retry tests wait
// tens of milliseconds, not seconds.
var millis = upstream.Headers{RetryAfter: []upstream.Delay{{Name: "Retry-After", Millis: true}}}

// script is an upstream answering with its statuses in turn (the last one
// from then on), recording each request's arrival and body.
type script struct {
	t        *testing.T
	statuses []int
	header   http.Header // set on every refused answer
	onArrive func(int)   // called with the arrival's index, if set
	srv      *httptest.Server
	mu       sync.Mutex
	arrivals []time.Time
	bodies   []string
}

func newScript(t *testing.T, header http.Header, statuses ...int) *script {
	s := &script{t: t, statuses: statuses, header: header}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		i := len(s.arrivals)
		s.arrivals = append(s.arrivals, time.Now())
		s.bodies = append(s.bodies, string(body))
		s.mu.Unlock()
		if s.onArrive != nil {
			s.onArrive(i)
		}
		status := s.statuses[min(i, len(s.statuses)-1)]
		if status != http.StatusOK {
			for k, v := range s.header {
				w.Header()[k] = v
			}
		}
		w.WriteHeader(status)
		io.WriteString(w, "answer "+http.StatusText(status))
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func (s *script) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.arrivals)
}

// limiter counts how it was entered. It has Enter, EnterN and Do.
type limiter struct {
	mu     sync.Mutex
	enters int
	costs  []int
	dos    int
	err    error // returned by every entering when set
}

func (l *limiter) Enter(ctx context.Context) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.enters++
	return l.err
}

func (l *limiter) EnterN(ctx context.Context, n int) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.costs = append(l.costs, n)
	return l.err
}

func (l *limiter) Do(ctx context.Context, fn func(context.Context) error) error {
	l.mu.Lock()
	l.dos++
	err := l.err
	l.mu.Unlock()
	if err != nil {
		return err
	}
	return fn(ctx)
}

// enterOnly has Enter and Do; doOnly has only Do.
type (
	enterOnly struct{ l *limiter }
	doOnly    struct{ l *limiter }
)

func (e enterOnly) Enter(ctx context.Context) error { return e.l.Enter(ctx) }
func (e enterOnly) Do(ctx context.Context, fn func(context.Context) error) error {
	return e.l.Do(ctx, fn)
}
func (d doOnly) Do(ctx context.Context, fn func(context.Context) error) error {
	return d.l.Do(ctx, fn)
}

// receiver is a limiter that records the Signals it is fed.
type receiver struct {
	limiter
	signals []upstream.Signal
	fbErr   error
}

func (r *receiver) Feedback(ctx context.Context, s upstream.Signal) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.signals = append(r.signals, s)
	return r.fbErr
}

func get(t *testing.T, c *http.Client, url string) (*http.Response, string) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func TestEntersOncePerRequest(t *testing.T) {
	s := newScript(t, nil, 200)
	lim := &limiter{}
	c := NewClient(lim)
	for range 3 {
		resp, body := get(t, c, s.srv.URL)
		if resp.StatusCode != 200 || body != "answer OK" {
			t.Fatalf("got %d %q", resp.StatusCode, body)
		}
	}
	if lim.enters != 3 || len(lim.costs) != 0 || lim.dos != 0 {
		t.Errorf("entered %d, with costs %v, Do %d times; want Enter 3 times", lim.enters, lim.costs, lim.dos)
	}
}

func TestEntering(t *testing.T) {
	s := newScript(t, nil, 200)
	cost := func(n int) Option { return WithCost(func(*http.Request) int { return n }) }
	tests := []struct {
		name        string
		lim         func(*limiter) sluice.Limiter
		opt         Option
		enters, dos int
		costs       []int
		wantErr     error
		arrivals    int
	}{
		{"cost 5 with EnterN", func(l *limiter) sluice.Limiter { return l }, cost(5), 0, 0, []int{5}, nil, 1},
		{"cost 1 uses Enter", func(l *limiter) sluice.Limiter { return l }, cost(1), 1, 0, nil, nil, 1},
		{"cost 0 with EnterN", func(l *limiter) sluice.Limiter { return l }, cost(0), 0, 0, []int{0}, nil, 1},
		{"Enter only", func(l *limiter) sluice.Limiter { return enterOnly{l} }, nil, 1, 0, nil, nil, 1},
		{"Enter only, cost 0 enters nothing", func(l *limiter) sluice.Limiter { return enterOnly{l} }, cost(0), 0, 0, nil, nil, 1},
		{"Enter only, cost 3 is a config error", func(l *limiter) sluice.Limiter { return enterOnly{l} }, cost(3), 0, 0, nil, sluice.ErrConfig, 0},
		{"Do only", func(l *limiter) sluice.Limiter { return doOnly{l} }, nil, 0, 1, nil, nil, 1},
		{"Do only, cost 2 is a config error", func(l *limiter) sluice.Limiter { return doOnly{l} }, cost(2), 0, 0, nil, errConfig, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := s.count()
			l := &limiter{}
			var opts []Option
			if tt.opt != nil {
				opts = append(opts, tt.opt)
			}
			body := &closeCounter{Reader: strings.NewReader("payload")}
			req, _ := http.NewRequest("POST", s.srv.URL, body)
			resp, err := New(nil, tt.lim(l), opts...).RoundTrip(req)
			if err == nil {
				resp.Body.Close()
			}
			if !matches(err, tt.wantErr) {
				t.Errorf("RoundTrip error %v, want %v", err, tt.wantErr)
			}
			if l.enters != tt.enters || l.dos != tt.dos || !equal(l.costs, tt.costs) {
				t.Errorf("Enter %d, Do %d, EnterN %v; want %d, %d, %v", l.enters, l.dos, l.costs, tt.enters, tt.dos, tt.costs)
			}
			if got := s.count() - before; got != tt.arrivals {
				t.Errorf("%d requests reached the upstream, want %d", got, tt.arrivals)
			}
			if body.closed() == 0 {
				t.Error("the request's body was never closed")
			}
		})
	}
}

// A limiter that refuses: nothing is sent, the body is closed, and the
// error comes back as it is.
func TestEnterErrorSendsNothing(t *testing.T) {
	s := newScript(t, nil, 200)
	refused := errors.New("refused")
	body := &closeCounter{Reader: strings.NewReader("x")}
	req, _ := http.NewRequest("POST", s.srv.URL, body)
	_, err := New(nil, &limiter{err: refused}).RoundTrip(req)
	if !errors.Is(err, refused) || s.count() != 0 || body.closed() == 0 {
		t.Errorf("err %v, %d sent, body closed %d times; want the limiter's error, none sent, body closed", err, s.count(), body.closed())
	}
}

func TestRetry(t *testing.T) {
	ra := http.Header{"Retry-After": {"60"}}
	t.Run("waits out Retry-After without a Receiver", func(t *testing.T) {
		s := newScript(t, ra, 429, 200)
		lim := &limiter{}
		resp, body := get(t, NewClient(lim, WithHeaders(millis)), s.srv.URL)
		if resp.StatusCode != 200 || body != "answer OK" || s.count() != 2 || lim.enters != 2 {
			t.Fatalf("got %d %q after %d requests and %d enters; want 200 after 2 and 2", resp.StatusCode, body, s.count(), lim.enters)
		}
		if gap := s.arrivals[1].Sub(s.arrivals[0]); gap < 60*time.Millisecond {
			t.Errorf("sent again %v after the 429, want at least the 60 ms asked", gap)
		}
	})
	t.Run("a Receiver's hold does the waiting", func(t *testing.T) {
		// 60 s asked: the test would time out if the Transport slept.
		s := newScript(t, http.Header{"Retry-After": {"60000"}}, 429, 200)
		lim := &receiver{}
		resp, _ := get(t, NewClient(lim, WithHeaders(millis)), s.srv.URL)
		if resp.StatusCode != 200 || s.count() != 2 {
			t.Fatalf("got %d after %d requests", resp.StatusCode, s.count())
		}
		if len(lim.signals) != 1 || !lim.signals[0].Refused || lim.signals[0].RetryAfter != time.Minute {
			t.Errorf("Feedback got %+v, want the refusal with its minute", lim.signals)
		}
	})
	t.Run("a Receiver that fails: the Transport waits", func(t *testing.T) {
		s := newScript(t, ra, 429, 200)
		lim := &receiver{fbErr: errors.New("redis down")}
		resp, _ := get(t, NewClient(lim, WithHeaders(millis)), s.srv.URL)
		if resp.StatusCode != 200 || s.count() != 2 {
			t.Fatalf("got %d after %d requests", resp.StatusCode, s.count())
		}
		if gap := s.arrivals[1].Sub(s.arrivals[0]); gap < 60*time.Millisecond {
			t.Errorf("sent again %v after the 429, want at least the 60 ms asked", gap)
		}
	})
	t.Run("bounded", func(t *testing.T) {
		s := newScript(t, http.Header{"Retry-After": {"1"}}, 429)
		resp, body := get(t, NewClient(&limiter{}, WithHeaders(millis), WithRetries(3)), s.srv.URL)
		if resp.StatusCode != 429 || body != "answer Too Many Requests" || s.count() != 4 {
			t.Errorf("got %d %q after %d requests; want the last 429, readable, after 1+3", resp.StatusCode, body, s.count())
		}
	})
	t.Run("WithRetries(0) never sends again", func(t *testing.T) {
		s := newScript(t, nil, 429, 200)
		resp, _ := get(t, NewClient(&limiter{}, WithRetries(0)), s.srv.URL)
		if resp.StatusCode != 429 || s.count() != 1 {
			t.Errorf("got %d after %d requests", resp.StatusCode, s.count())
		}
	})
	t.Run("a 503 without Retry-After is not retried", func(t *testing.T) {
		s := newScript(t, nil, 503, 200)
		resp, _ := get(t, NewClient(&limiter{}), s.srv.URL)
		if resp.StatusCode != 503 || s.count() != 1 {
			t.Errorf("got %d after %d requests", resp.StatusCode, s.count())
		}
	})
	t.Run("a 503 with Retry-After is", func(t *testing.T) {
		s := newScript(t, http.Header{"Retry-After": {"0"}}, 503, 200)
		resp, _ := get(t, NewClient(&limiter{}), s.srv.URL)
		if resp.StatusCode != 200 || s.count() != 2 {
			t.Errorf("got %d after %d requests", resp.StatusCode, s.count())
		}
	})
	t.Run("a replayable body is sent whole again; the caller's request is untouched", func(t *testing.T) {
		s := newScript(t, http.Header{"Retry-After": {"1"}}, 429, 200)
		req, _ := http.NewRequest("PUT", s.srv.URL, bytes.NewReader([]byte("the payload")))
		req.Header.Set("X-Mine", "1")
		orig, origHeader := req.Body, req.Header.Clone()
		resp, err := New(nil, &limiter{}, WithHeaders(millis)).RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 || s.count() != 2 || s.bodies[0] != "the payload" || s.bodies[1] != "the payload" {
			t.Errorf("got %d after %d requests with bodies %q", resp.StatusCode, s.count(), s.bodies)
		}
		if req.Body != orig || len(req.Header) != len(origHeader) || req.Header.Get("X-Mine") != "1" {
			t.Error("the caller's request was modified")
		}
	})
	t.Run("a body that cannot be replayed is not sent again", func(t *testing.T) {
		s := newScript(t, http.Header{"Retry-After": {"1"}}, 429, 200)
		req, _ := http.NewRequest("POST", s.srv.URL, io.NopCloser(strings.NewReader("once")))
		req.GetBody = nil
		resp, err := New(nil, &limiter{}, WithHeaders(millis)).RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 429 || s.count() != 1 {
			t.Errorf("got %d after %d requests, want the 429 after 1", resp.StatusCode, s.count())
		}
	})
	t.Run("a deadline before the wait's end returns the refusal at once", func(t *testing.T) {
		s := newScript(t, http.Header{"Retry-After": {"3600"}}, 429, 200)
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", s.srv.URL, nil)
		resp, err := New(nil, &limiter{}).RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 429 || s.count() != 1 || ctx.Err() != nil {
			t.Errorf("got %d after %d requests", resp.StatusCode, s.count())
		}
	})
	t.Run("cancelled while waiting", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		s := newScript(t, http.Header{"Retry-After": {"3600"}}, 429, 200)
		s.onArrive = func(int) { cancel() }
		req, _ := http.NewRequestWithContext(ctx, "GET", s.srv.URL, nil)
		resp, err := New(nil, &limiter{}).RoundTrip(req)
		if err == nil {
			resp.Body.Close()
		}
		// The cancellation may hit the first exchange or the wait after it.
		if !errors.Is(err, context.Canceled) || s.count() != 1 {
			t.Errorf("got %v after %d requests, want context.Canceled after 1", err, s.count())
		}
	})
}

// Feedback gets every Signal that says something, and nothing else.
func TestFeedback(t *testing.T) {
	s := newScript(t, nil, 200)
	lim := &receiver{}
	c := NewClient(lim)
	get(t, c, s.srv.URL)
	if len(lim.signals) != 0 {
		t.Errorf("a response that says nothing was fed back: %+v", lim.signals)
	}
	quota := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-RateLimit-Remaining", "7")
	}))
	defer quota.Close()
	get(t, c, quota.URL)
	want := upstream.Signal{Status: 200, Quotas: []upstream.Quota{{Limit: -1, Remaining: 7}}}
	if len(lim.signals) != 1 || lim.signals[0].Status != 200 || len(lim.signals[0].Quotas) != 1 || lim.signals[0].Quotas[0] != want.Quotas[0] {
		t.Errorf("Feedback got %+v, want %+v", lim.signals, want)
	}
}

func TestCloseIdleConnections(t *testing.T) {
	base := &idleCounter{}
	NewClient(&limiter{}).CloseIdleConnections() // http.DefaultTransport has it
	(&http.Client{Transport: New(base, &limiter{})}).CloseIdleConnections()
	if base.n != 1 {
		t.Errorf("the base's CloseIdleConnections was called %d times, want 1", base.n)
	}
	New(roundTripFunc(func(*http.Request) (*http.Response, error) { return nil, nil }), &limiter{}).CloseIdleConnections()
}

type idleCounter struct {
	roundTripFunc
	n int
}

func (c *idleCounter) CloseIdleConnections() { c.n++ }

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

type closeCounter struct {
	io.Reader
	mu sync.Mutex
	n  int
}

func (c *closeCounter) Close() error {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
	return nil
}

func (c *closeCounter) closed() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func matches(err, target error) bool {
	if target == nil {
		return err == nil
	}
	return errors.Is(err, target)
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
