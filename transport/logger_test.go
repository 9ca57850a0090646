package transport

import (
	"bytes"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/sluicehq/sluice/upstream"
)

// logBuffer is a Logger's output that a test reads.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() == 0 {
		return nil
	}
	return strings.Split(strings.TrimSpace(l.b.String()), "\n")
}

// TestLogsUnreadableHeaders: a real server sends OpenAI's headers with a
// reset that cannot be read; the Transport says so through its Logger,
// with the header's name and value, once for a run of responses that all
// carry it, and still feeds back what it could read.
func TestLogsUnreadableHeaders(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("x-ratelimit-remaining-tokens", "149984")
		w.Header().Set("x-ratelimit-reset-tokens", "six minutes")
		if r.URL.Path == "/both" {
			w.Header().Set("x-ratelimit-limit-requests", "sixty")
		}
	}))
	defer api.Close()
	var logs logBuffer
	lim := &receiver{}
	c := NewClient(lim, WithHeaders(upstream.OpenAI), WithLogger(slog.New(slog.NewTextHandler(&logs, nil))))
	for range 3 {
		get(t, c, api.URL)
	}
	lines := logs.lines()
	if len(lines) != 1 {
		t.Fatalf("3 responses with the same unreadable header logged %d lines, want 1:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	host := strings.TrimPrefix(api.URL, "http://")
	for _, want := range []string{"level=WARN", "header=x-ratelimit-reset-tokens", `value="six minutes"`, "status=200", "host=" + host} {
		if !strings.Contains(lines[0], want) {
			t.Errorf("log line %q lacks %s", lines[0], want)
		}
	}
	// Another header name is logged on its own; the first one is not again.
	get(t, c, api.URL+"/both")
	lines = logs.lines()
	if len(lines) != 2 || !strings.Contains(lines[1], "header=x-ratelimit-limit-requests") || !strings.Contains(lines[1], "value=sixty") {
		t.Errorf("after a second unreadable header the log is:\n%s\nwant one more line, for x-ratelimit-limit-requests", strings.Join(lines, "\n"))
	}
	// What could be read was still fed back, with the unreadable listed.
	lim.mu.Lock()
	defer lim.mu.Unlock()
	if len(lim.signals) != 4 {
		t.Fatalf("%d signals fed back, want 4", len(lim.signals))
	}
	s := lim.signals[0]
	if len(s.Quotas) != 1 || s.Quotas[0].Remaining != 149984 || s.Quotas[0].Reset != 0 ||
		len(s.Unreadable) != 1 || s.Unreadable[0] != (upstream.Field{Name: "x-ratelimit-reset-tokens", Value: "six minutes"}) {
		t.Errorf("fed back %+v", s)
	}
}

// TestNoLoggerLogsNothing: without WithLogger an unreadable header costs
// nothing and the request goes through.
func TestNoLoggerLogsNothing(t *testing.T) {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-RateLimit-Remaining", "lots")
	}))
	defer api.Close()
	resp, body := get(t, NewClient(&limiter{}, WithLogger(nil)), api.URL)
	if resp.StatusCode != 200 || body != "" {
		t.Errorf("got %d %q", resp.StatusCode, body)
	}
}
