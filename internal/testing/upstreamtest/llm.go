package upstreamtest

import (
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"sync"
	"time"
)

// LLMConfig configures an LLM.
type LLMConfig struct {
	// Requests and Tokens are the two limits, as OpenAI's API has them:
	// each a bucket of at most Burst, refilled continuously at Rate per
	// Period (Period 0 means one second, Burst 0 means 1). A request takes
	// one request and its prompt_tokens + max_tokens tokens at its
	// arrival, from both or from neither.
	Requests, Tokens Policy
	// Latency is how long a request runs: its answer is complete, and
	// the tokens its output did not use go back to the token limit, that
	// long after its arrival.
	Latency time.Duration
	// MinOutput is the shortest output, in percent of max_tokens: each
	// output is drawn uniformly from it to max_tokens. 0 means 10.
	MinOutput int
	// Seed seeds the outputs' draws, so that a run can be replayed.
	Seed uint64
}

// LLMStats counts what an LLM answered.
type LLMStats struct {
	Arrivals int
	Accepted int // answered 200
	Refused  int // answered 429
	Invalid  int // answered 400: a body it cannot read, or more tokens than the limit's burst
	// PromptTokens and OutputTokens are the accepted requests' tokens:
	// what the upstream counts as used. Reserved is what they took at
	// arrival, prompt_tokens + max_tokens.
	PromptTokens, OutputTokens, Reserved int64
	// First and Last are the first arrival and the last.
	First, Last time.Time
	// TokenQuota is what the token limit allowed from the first arrival
	// to the last: its burst, plus its rate over that span.
	TokenQuota float64
}

// Used is the tokens the accepted requests used, prompts and outputs.
func (s LLMStats) Used() int64 { return s.PromptTokens + s.OutputTokens }

// LLM is a running test upstream that limits requests and tokens as an
// LLM API does: a request needs its prompt_tokens + max_tokens at
// arrival, else it is answered 429 with Retry-After in whole seconds
// rounded up; when it ends, Latency later, the tokens its output did not
// use go back. Each answer carries OpenAI's x-ratelimit-limit-,
// -remaining- and -reset-requests and -tokens headers, and an accepted
// one OpenAI's usage object.
//
// A request is a POST whose JSON body gives {"prompt_tokens": n,
// "max_tokens": m}; with "stream": true the answer is a stream of
// server-sent events spread over Latency, ending with data: [DONE], and
// its last event before that carries the usage when
// "stream_options": {"include_usage": true} asks for it. The methods of an
// LLM are safe for concurrent use.
type LLM struct {
	srv     *httptest.Server
	latency time.Duration

	mu       sync.Mutex
	requests limit
	tokens   limit
	refunds  []refund // by when they are due
	draw     func(max int) int
	stats    LLMStats
}

// limit is a bucket refilled continuously.
type limit struct {
	rate  float64 // per second
	burst float64
	level float64
	at    time.Time // the level is as of then
}

// refund is tokens that go back to the token limit at a request's end.
type refund struct {
	at time.Time
	n  float64
}

// NewLLM starts an LLM on a free loopback port. Close it when done.
func NewLLM(cfg LLMConfig) *LLM {
	minOut := cfg.MinOutput
	if minOut == 0 {
		minOut = 10
	}
	minOut = min(max(minOut, 0), 100)
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x11a))
	s := &LLM{
		latency:  cfg.Latency,
		requests: limitOf(cfg.Requests),
		tokens:   limitOf(cfg.Tokens),
		draw: func(m int) int {
			lo := (m*minOut + 99) / 100
			return lo + rng.IntN(m-lo+1)
		},
	}
	s.srv = httptest.NewServer(http.HandlerFunc(s.serve))
	return s
}

func limitOf(p Policy) limit {
	period, burst := p.Period, float64(max(p.Burst, 1))
	if period == 0 {
		period = time.Second
	}
	return limit{rate: float64(p.Rate) / period.Seconds(), burst: burst, level: burst}
}

// URL is the server's base URL, http://127.0.0.1:port.
func (s *LLM) URL() string { return s.srv.URL }

// Close stops the server and waits for the requests in progress.
func (s *LLM) Close() { s.srv.Close() }

// Stats returns the counts so far.
func (s *LLM) Stats() LLMStats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	if !st.First.IsZero() {
		st.TokenQuota = s.tokens.burst + s.tokens.rate*st.Last.Sub(st.First).Seconds()
	}
	return st
}

// llmRequest is what the LLM reads of a request.
type llmRequest struct {
	Prompt        int  `json:"prompt_tokens"`
	Max           int  `json:"max_tokens"`
	Stream        bool `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
}

// verdict is the LLM's judgement of a request.
type verdict struct {
	status int
	wait   time.Duration // until both limits would have room, when refused
	output int           // the output's tokens, when accepted
	left   levels
}

// levels are what the rate-limit headers say.
type levels struct {
	requests, tokens limit
}

func (s *LLM) serve(w http.ResponseWriter, r *http.Request) {
	var req llmRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || req.Prompt < 0 || req.Max < 0 {
		s.judgeInvalid(time.Now())
		http.Error(w, `{"error":{"message":"the body needs prompt_tokens and max_tokens, both ≥ 0","type":"invalid_request_error"}}`, http.StatusBadRequest)
		return
	}
	start := time.Now()
	v := s.judge(start, req.Prompt, req.Max)
	switch v.status {
	case http.StatusBadRequest:
		http.Error(w, `{"error":{"message":"more tokens than the limit's burst","type":"invalid_request_error"}}`, v.status)
		return
	case http.StatusTooManyRequests:
		v.left.write(w.Header())
		w.Header().Set("Retry-After", strconv.FormatInt(ceilSeconds(v.wait), 10))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(v.status)
		fmt.Fprint(w, `{"error":{"message":"Rate limit reached","type":"rate_limit_exceeded","code":"rate_limit_exceeded"}}`)
		return
	}
	usage := fmt.Sprintf(`{"prompt_tokens":%d,"completion_tokens":%d,"total_tokens":%d}`, req.Prompt, v.output, req.Prompt+v.output)
	if !req.Stream {
		if !sleepUntil(r, start.Add(s.latency)) {
			return
		}
		s.levelsAt(time.Now()).write(w.Header())
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"%d tokens"},"finish_reason":"stop"}],"usage":%s}`+"\n",
			v.output, usage)
		return
	}
	// A stream's headers leave at once, as a real stream's do.
	v.left.write(w.Header())
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	const chunks = 4
	flusher, _ := w.(http.Flusher)
	noUsage := "" // OpenAI's chunks say "usage": null when the last one will carry it
	if req.StreamOptions.IncludeUsage {
		noUsage = `,"usage":null`
	}
	for i := range chunks {
		fmt.Fprintf(w, `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"part %d"}}]%s}`+"\n\n", i, noUsage)
		if flusher != nil {
			flusher.Flush()
		}
		if !sleepUntil(r, start.Add(s.latency*time.Duration(i+1)/chunks)) {
			return
		}
	}
	if req.StreamOptions.IncludeUsage {
		fmt.Fprintf(w, `data: {"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[],"usage":%s}`+"\n\n", usage)
	}
	fmt.Fprint(w, "data: [DONE]\n\n")
}

// sleepUntil waits until t, or until the client has gone (false).
func sleepUntil(r *http.Request, t time.Time) bool {
	timer := time.NewTimer(time.Until(t))
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-r.Context().Done():
		return false
	}
}

// judge decides on a request of prompt and max tokens arriving at now.
func (s *LLM) judge(now time.Time, prompt, maxTokens int) verdict {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.arrive(now)
	need := float64(prompt + maxTokens)
	if need > s.tokens.burst {
		s.stats.Invalid++
		return verdict{status: http.StatusBadRequest}
	}
	v := verdict{status: http.StatusOK}
	for _, c := range []struct {
		l    *limit
		need float64
	}{{&s.requests, 1}, {&s.tokens, need}} {
		if c.l.level < c.need {
			v.status = http.StatusTooManyRequests
			v.wait = max(v.wait, time.Duration(math.Ceil((c.need-c.l.level)/c.l.rate*1e9)))
		}
	}
	if v.status == http.StatusOK {
		s.requests.level--
		s.tokens.level -= need
		v.output = s.draw(maxTokens)
		if back := maxTokens - v.output; back > 0 {
			at := now.Add(s.latency)
			i, _ := slices.BinarySearchFunc(s.refunds, at, func(r refund, t time.Time) int { return r.at.Compare(t) })
			s.refunds = slices.Insert(s.refunds, i, refund{at: at, n: float64(back)})
		}
		s.stats.Accepted++
		s.stats.PromptTokens += int64(prompt)
		s.stats.OutputTokens += int64(v.output)
		s.stats.Reserved += int64(prompt + maxTokens)
	} else {
		s.stats.Refused++
	}
	v.left = levels{s.requests, s.tokens}
	return v
}

// judgeInvalid counts a request whose body could not be read.
func (s *LLM) judgeInvalid(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.arrive(now)
	s.stats.Invalid++
}

// arrive brings the limits to now and counts an arrival; s.mu is held.
func (s *LLM) arrive(now time.Time) {
	s.advance(now)
	if s.stats.First.IsZero() {
		s.stats.First = now
	}
	s.stats.Last = later(s.stats.Last, now)
	s.stats.Arrivals++
}

// levelsAt is the limits' levels at now.
func (s *LLM) levelsAt(now time.Time) levels {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.advance(now)
	return levels{s.requests, s.tokens}
}

// advance refills both limits to now, the refunds due by then given back
// when they were due; s.mu is held.
func (s *LLM) advance(now time.Time) {
	n := 0
	for _, r := range s.refunds {
		if r.at.After(now) {
			break
		}
		s.tokens.refill(r.at)
		s.tokens.level = min(s.tokens.burst, s.tokens.level+r.n)
		n++
	}
	s.refunds = s.refunds[n:]
	s.requests.refill(now)
	s.tokens.refill(now)
}

// refill brings l to t; an earlier t changes nothing.
func (l *limit) refill(t time.Time) {
	if !l.at.IsZero() && t.After(l.at) {
		l.level = min(l.burst, l.level+l.rate*t.Sub(l.at).Seconds())
	}
	l.at = later(l.at, t)
}

// write sets OpenAI's rate-limit headers: each limit's burst, its whole
// tokens left, and the time until it is full again.
func (lv levels) write(h http.Header) {
	for _, x := range []struct {
		name string
		l    limit
	}{{"requests", lv.requests}, {"tokens", lv.tokens}} {
		h.Set("x-ratelimit-limit-"+x.name, strconv.FormatInt(int64(x.l.burst), 10))
		h.Set("x-ratelimit-remaining-"+x.name, strconv.FormatInt(int64(math.Floor(max(x.l.level, 0))), 10))
		full := time.Duration(math.Ceil((x.l.burst-x.l.level)/x.l.rate*1e3)) * time.Millisecond
		h.Set("x-ratelimit-reset-"+x.name, full.String())
	}
}
