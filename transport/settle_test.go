package transport_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/local"
	"github.com/sluicehq/sluice/transport"
)

// The bodies the test upstreams answer, as OpenAI's and Anthropic's APIs
// write them.
const (
	openAIJSON = `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello"},"finish_reason":"stop"}],` +
		`"usage":{"prompt_tokens":21,"completion_tokens":300,"total_tokens":321}}` + "\n"
	openAIStream = `data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hel"}}],"usage":null}` + "\n\n" +
		`data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"lo"}}],"usage":null}` + "\n\n" +
		`data: {"id":"c1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":21,"completion_tokens":300,"total_tokens":321}}` + "\n\n" +
		"data: [DONE]\n\n"
	// Without stream_options.include_usage: no event carries usage.
	openAIStreamNoUsage = `data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"Hel"}}]}` + "\n\n" +
		"data: [DONE]\n\n"
	anthropicJSON = `{"id":"msg_1","type":"message","role":"assistant","content":[{"type":"text","text":"Hello"}],"stop_reason":"end_turn",` +
		`"usage":{"input_tokens":120,"cache_creation_input_tokens":30,"cache_read_input_tokens":400,"output_tokens":77}}`
	// With CRLF line ends, event fields, a comment, and a data field split
	// over two lines.
	anthropicStream = "event: message_start\r\n" +
		`data: {"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],` +
		`"usage":{"input_tokens":120,"cache_creation_input_tokens":30,"cache_read_input_tokens":400,"output_tokens":1}}}` + "\r\n\r\n" +
		": ping\r\n\r\n" +
		"event: content_block_delta\r\n" +
		`data: {"type":"content_block_delta","index":0,` + "\r\n" + `data: "delta":{"type":"text_delta","text":"Hello"}}` + "\r\n\r\n" +
		"event: message_delta\r\n" +
		`data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":40}}` + "\r\n\r\n" +
		"event: message_delta\r\n" +
		`data: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":77}}` + "\r\n\r\n" +
		"event: message_stop\r\n" +
		`data: {"type":"message_stop"}` + "\r\n\r\n"
)

// llmAPI is an upstream answering every request with body, as a stream
// of events when stream is set, written in pieces of 7 bytes so that
// events are cut across reads.
func llmAPI(t *testing.T, body string, stream bool) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if stream {
			w.Header().Set("Content-Type", "text/event-stream")
		} else {
			w.Header().Set("Content-Type", "application/json")
		}
		for len(body) > 0 {
			n := min(7, len(body))
			io.WriteString(w, body[:n])
			w.(http.Flusher).Flush()
			body = body[n:]
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// settleBucket is a bucket counting calls (10) and units (10,000 each)
// that refills too slowly to change during a test: its levels move only
// by what the transport reserves and settles.
func settleBucket(t *testing.T, srv *redistest.Server, units ...string) *bucket.Bucket {
	t.Helper()
	cfg := bucket.Config{Name: t.Name(), Capacity: 10, RefillAmount: 1, RefillFrequency: time.Hour}
	for _, u := range units {
		cfg.Policies = append(cfg.Policies, bucket.Policy{Unit: u, Capacity: 10_000, RefillAmount: 1, RefillFrequency: time.Hour})
	}
	rdb := srv.Client()
	t.Cleanup(func() { rdb.Close() })
	b, err := bucket.New(rdb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.Close() })
	return b
}

// levelsOf reads every policy's tokens: calls first, then the units.
func levelsOf(t *testing.T, b *bucket.Bucket) []int64 {
	t.Helper()
	in, err := b.Inspect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	var out []int64
	for _, l := range in.Levels {
		out = append(out, l.Tokens)
	}
	return out
}

func wantLevels(t *testing.T, b *bucket.Bucket, what string, want ...int64) {
	t.Helper()
	if got := levelsOf(t, b); fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("%s: levels %v, want %v", what, got, want)
	}
}

// logLines is a Logger's output that a test reads.
type logLines struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logLines) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// post sends a chat request of maxTokens through c and returns the
// response, its body not read.
func post(t *testing.T, c *http.Client, url string, maxTokens int) *http.Response {
	t.Helper()
	body := fmt.Sprintf(`{"model":"m","max_tokens":%d,"messages":[{"role":"user","content":"Hi"}]}`, maxTokens)
	req, err := http.NewRequest("POST", url, strings.NewReader(body)) // GetBody set: replayable
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// estimateOf estimates a chat request as the example does: its body read
// through GetBody, 100 tokens of prompt and its max_tokens of output, in
// the units given.
func estimateOf(total, input, output string) func(*http.Request) bucket.Cost {
	return func(req *http.Request) bucket.Cost {
		var chat struct {
			MaxTokens int `json:"max_tokens"`
		}
		if req.GetBody != nil {
			if body, err := req.GetBody(); err == nil {
				json.NewDecoder(body).Decode(&chat)
				body.Close()
			}
		}
		c := bucket.Cost{"": 1}
		if total != "" {
			c[total] = 100 + chat.MaxTokens
		}
		if input != "" {
			c[input] = 100
		}
		if output != "" {
			c[output] = chat.MaxTokens
		}
		return c
	}
}

// TestReserveSettlesOpenAI: an OpenAI answer, whole or streamed, settles
// the reservation at its total_tokens: the bucket's tokens are its
// capacity less the tokens used, and the call keeps its cost of one. The
// whole answer is decoded with a json.Decoder, which stops before the
// body's end: Close settles.
func TestReserveSettlesOpenAI(t *testing.T) {
	srv := redistest.New(t)
	for _, tc := range []struct {
		name   string
		body   string
		stream bool
	}{{"json", openAIJSON, false}, {"stream", openAIStream, true}} {
		t.Run(tc.name, func(t *testing.T) {
			api := llmAPI(t, tc.body, tc.stream)
			b := settleBucket(t, srv, "tokens")
			c := &http.Client{Transport: transport.New(nil, b, transport.WithReserve(estimateOf("tokens", "", ""), transport.OpenAIUsage))}
			resp := post(t, c, api.URL, 1000)
			wantLevels(t, b, "during the call", 9, 10_000-1100)
			if tc.stream {
				io.Copy(io.Discard, resp.Body)
			} else {
				var answer map[string]any
				if err := json.NewDecoder(resp.Body).Decode(&answer); err != nil {
					t.Fatal(err)
				}
			}
			resp.Body.Close()
			wantLevels(t, b, "after the call", 9, 10_000-321)
		})
	}
}

// TestReserveSettlesAnthropic: an Anthropic answer, whole or streamed
// (message_start's input, the last message_delta's output), settles each
// unit the estimate names: input tokens with the cache's creation, not
// its reads, and output tokens. The body is read to its end and not
// closed: the end settles.
func TestReserveSettlesAnthropic(t *testing.T) {
	srv := redistest.New(t)
	for _, tc := range []struct {
		name   string
		body   string
		stream bool
	}{{"json", anthropicJSON, false}, {"stream", anthropicStream, true}} {
		t.Run(tc.name, func(t *testing.T) {
			api := llmAPI(t, tc.body, tc.stream)
			b := settleBucket(t, srv, "input_tokens", "output_tokens")
			c := &http.Client{Transport: transport.New(nil, b,
				transport.WithReserve(estimateOf("", "input_tokens", "output_tokens"), transport.AnthropicUsage))}
			resp := post(t, c, api.URL, 1000)
			wantLevels(t, b, "during the call", 9, 10_000-100, 10_000-1000)
			if _, err := io.Copy(io.Discard, resp.Body); err != nil {
				t.Fatal(err)
			}
			wantLevels(t, b, "after the body's end", 9, 10_000-150, 10_000-77)
			resp.Body.Close()
			wantLevels(t, b, "after Close", 9, 10_000-150, 10_000-77)
		})
	}
}

// TestReserveAnthropicClosedEarly: an Anthropic stream closed after its
// message_start settles the input it reported; its output, not yet
// reported, keeps its estimate.
func TestReserveAnthropicClosedEarly(t *testing.T) {
	srv := redistest.New(t)
	release := make(chan struct{})
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		start, _, _ := strings.Cut(anthropicStream, "\r\n\r\n")
		io.WriteString(w, start+"\r\n\r\n")
		w.(http.Flusher).Flush()
		select { // the rest would come later
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer api.Close()
	defer close(release)
	b := settleBucket(t, srv, "input_tokens", "output_tokens", "tokens")
	c := &http.Client{Transport: transport.New(nil, b,
		transport.WithReserve(estimateOf("tokens", "input_tokens", "output_tokens"), transport.AnthropicUsage))}
	resp := post(t, c, api.URL, 1000)
	r := bufio.NewReader(resp.Body)
	for { // through message_start's blank line
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if line == "\r\n" {
			break
		}
	}
	resp.Body.Close()
	wantLevels(t, b, "after Close", 9, 10_000-150, 10_000-1000, 10_000-1100)
}

// TestReserveCancelsRefused: a 429 gives the whole estimate back, the
// call too; the request sent again after it is settled as usual.
func TestReserveCancelsRefused(t *testing.T) {
	srv := redistest.New(t)
	var n sync.Map
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if _, again := n.LoadOrStore(r.URL.Path, true); !again || r.URL.Path == "/always" {
			w.Header().Set("Retry-After", "0")
			w.WriteHeader(http.StatusTooManyRequests)
			io.WriteString(w, `{"error":{"message":"Rate limit reached","type":"tokens"}}`)
			return
		}
		io.WriteString(w, openAIJSON)
	}))
	defer api.Close()
	b := settleBucket(t, srv, "tokens")

	c := &http.Client{Transport: transport.New(nil, b, transport.WithRetries(0), transport.WithReserve(estimateOf("tokens", "", ""), transport.OpenAIUsage))}
	resp := post(t, c, api.URL+"/always", 1000)
	if resp.StatusCode != http.StatusTooManyRequests {
		t.Fatalf("status %d, want 429", resp.StatusCode)
	}
	wantLevels(t, b, "after the 429, before its body is read", 10, 10_000)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	wantLevels(t, b, "after the 429", 10, 10_000)

	c = &http.Client{Transport: transport.New(nil, b, transport.WithRetries(1), transport.WithReserve(estimateOf("tokens", "", ""), transport.OpenAIUsage))}
	resp = post(t, c, api.URL+"/once", 1000)
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d after a retry, want 200", resp.StatusCode)
	}
	wantLevels(t, b, "after a 429 and a 200", 9, 10_000-321)
}

// TestReserveCancelsOnTransportError: a request that fails before an
// answer (the connection refused, or closed by the server before it
// answered) gives the whole estimate back.
func TestReserveCancelsOnTransportError(t *testing.T) {
	srv := redistest.New(t)
	closed := httptest.NewServer(http.NotFoundHandler())
	closed.Close()
	hangUp := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		conn, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close()
		}
	}))
	defer hangUp.Close()
	for _, tc := range []struct{ name, url string }{{"refused", closed.URL}, {"hung up", hangUp.URL}} {
		t.Run(tc.name, func(t *testing.T) {
			b := settleBucket(t, srv, "tokens")
			c := &http.Client{Transport: transport.New(nil, b, transport.WithReserve(estimateOf("tokens", "", ""), transport.OpenAIUsage))}
			req, _ := http.NewRequest("POST", tc.url, strings.NewReader(`{"max_tokens":1000}`))
			resp, err := c.Do(req)
			if err == nil {
				resp.Body.Close()
				t.Fatalf("status %d, want an error", resp.StatusCode)
			}
			wantLevels(t, b, "after the error", 10, 10_000)
		})
	}
}

// TestReserveKeepsEstimateWithoutUsage: a stream closed before its usage,
// or one that never carries any, settles nothing: the call stays counted
// at its estimate, and the Logger says so, once a minute.
func TestReserveKeepsEstimateWithoutUsage(t *testing.T) {
	srv := redistest.New(t)
	release := make(chan struct{})
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		if r.URL.Path == "/no-usage" {
			io.WriteString(w, openAIStreamNoUsage)
			return
		}
		first, _, _ := strings.Cut(openAIStream, "\n\n")
		io.WriteString(w, first+"\n\n")
		w.(http.Flusher).Flush()
		select { // the rest, with the usage, would come later
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer api.Close()
	defer close(release)
	for _, path := range []string{"/early", "/no-usage"} {
		t.Run(path[1:], func(t *testing.T) {
			b := settleBucket(t, srv, "tokens")
			var logs logLines
			c := &http.Client{Transport: transport.New(nil, b, transport.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))),
				transport.WithReserve(estimateOf("tokens", "", ""), transport.OpenAIUsage))}
			for range 2 {
				resp := post(t, c, api.URL+path, 1000)
				if path == "/early" {
					buf := make([]byte, 10)
					if _, err := io.ReadFull(resp.Body, buf); err != nil {
						t.Fatal(err)
					}
				} else {
					io.Copy(io.Discard, resp.Body)
				}
				resp.Body.Close()
			}
			wantLevels(t, b, "after two calls", 8, 10_000-2*1100)
			if n := strings.Count(logs.String(), "carried no usage"); n != 1 {
				t.Errorf("%d log lines of a response without usage, want 1:\n%s", n, logs.String())
			}
		})
	}
}

// TestReserveSettleBounded: with Redis frozen, the settle at the body's
// end gives up after its bound (1 s) and tells the Logger; the call
// stays counted at its estimate.
func TestReserveSettleBounded(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	api := llmAPI(t, openAIJSON, false)
	b := settleBucket(t, srv, "tokens")
	var logs logLines
	c := &http.Client{Transport: transport.New(nil, b, transport.WithLogger(slog.New(slog.NewTextHandler(&logs, nil))),
		transport.WithReserve(estimateOf("tokens", "", ""), transport.OpenAIUsage))}
	resp := post(t, c, api.URL, 1000)
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	took := time.Since(start)
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	if took < 900*time.Millisecond || took > 3*time.Second {
		t.Errorf("reading and closing the body took %v with Redis frozen; want about the 1 s bound", took)
	}
	if !strings.Contains(logs.String(), "settling a reservation failed") {
		t.Errorf("the Logger heard nothing of the failed settle:\n%s", logs.String())
	}
	wantLevels(t, b, "after the failed settle", 9, 10_000-1100)
}

// TestReserveNeedsReserve: a limiter without Reserve is a configuration
// error, and nothing is sent.
func TestReserveNeedsReserve(t *testing.T) {
	api := llmAPI(t, openAIJSON, false)
	lim, err := local.NewRate(local.RateConfig{Rate: 10})
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Transport: transport.New(nil, lim, transport.WithReserve(estimateOf("tokens", "", ""), transport.OpenAIUsage))}
	req, _ := http.NewRequest("POST", api.URL, strings.NewReader(`{}`))
	resp, err := c.Do(req)
	if err == nil {
		resp.Body.Close()
	}
	if !errors.Is(err, sluice.ErrConfig) {
		t.Errorf("err %v, want one matching sluice.ErrConfig", err)
	}
}

// The usage readers on the documents of each API: what they report, and
// which documents carry no usage.
func TestUsageReaders(t *testing.T) {
	for _, tc := range []struct {
		name  string
		usage transport.Usage
		docs  []string
		want  bucket.Cost // nil: no usage
	}{
		{"openai chat", transport.OpenAIUsage, []string{openAIJSON}, bucket.Cost{"tokens": 321, "input_tokens": 21, "output_tokens": 300}},
		{"openai chunk without usage", transport.OpenAIUsage, []string{`{"choices":[],"usage":null}`}, nil},
		{"openai error", transport.OpenAIUsage, []string{`{"error":{"message":"bad"}}`}, nil},
		{"openai embedding", transport.OpenAIUsage, []string{`{"object":"list","data":[],"usage":{"prompt_tokens":8,"total_tokens":8}}`},
			bucket.Cost{"tokens": 8, "input_tokens": 8, "output_tokens": 0}},
		{"openai responses", transport.OpenAIUsage, []string{`{"type":"response.completed","response":{"usage":{"input_tokens":5,"output_tokens":7,"total_tokens":12}}}`},
			bucket.Cost{"tokens": 12, "input_tokens": 5, "output_tokens": 7}},
		{"not json", transport.OpenAIUsage, []string{`{"usage":`}, nil},
		{"anthropic message", transport.AnthropicUsage, []string{anthropicJSON}, bucket.Cost{"tokens": 227, "input_tokens": 150, "output_tokens": 77}},
		{"anthropic stream", transport.AnthropicUsage, []string{
			`{"type":"message_start","message":{"usage":{"input_tokens":10,"output_tokens":1}}}`,
			`{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}`,
			`{"type":"message_delta","usage":{"output_tokens":33}}`,
		}, bucket.Cost{"tokens": 43, "input_tokens": 10, "output_tokens": 33}},
		{"anthropic ping", transport.AnthropicUsage, []string{`{"type":"ping"}`}, nil},
		{"anthropic message_start alone", transport.AnthropicUsage, []string{
			`{"type":"message_start","message":{"usage":{"input_tokens":10,"cache_creation_input_tokens":5,"output_tokens":1}}}`,
		}, bucket.Cost{"input_tokens": 15}},
	} {
		seen := bucket.Cost{}
		found := false
		for _, d := range tc.docs {
			found = tc.usage([]byte(d), seen) || found
		}
		if tc.want == nil {
			if found || len(seen) > 0 {
				t.Errorf("%s: usage %v (found %v), want none", tc.name, seen, found)
			}
			continue
		}
		if !found || fmt.Sprint(seen) != fmt.Sprint(tc.want) {
			t.Errorf("%s: usage %v (found %v), want %v", tc.name, seen, found, tc.want)
		}
	}
}
