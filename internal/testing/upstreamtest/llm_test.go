package upstreamtest

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/sluicehq/sluice/upstream"
)

// The judging is exact on fake instants: 2 requests a second, burst 3;
// 100 tokens a second, burst 100; a request runs 1 s and its output is
// half its max_tokens, the other half given back at its end.
func TestLLMJudge(t *testing.T) {
	s := &LLM{latency: time.Second, requests: limitOf(Policy{Rate: 2, Burst: 3}), tokens: limitOf(Policy{Rate: 100, Burst: 100}),
		draw: func(m int) int { return m / 2 }}
	t0 := time.Unix(1000, 0)
	steps := []struct {
		at            time.Duration
		prompt, max   int
		status        int
		wait          time.Duration
		requests, tok int // whole ones left after it
	}{
		{0, 10, 40, 200, 0, 2, 50},
		{0, 10, 40, 200, 0, 1, 0},
		{0, 1, 0, 429, 10 * time.Millisecond, 1, 0},                        // a token in 10 ms
		{100 * time.Millisecond, 5, 10, 429, 50 * time.Millisecond, 1, 10}, // 10 there, 15 needed
		{150 * time.Millisecond, 5, 10, 200, 0, 0, 0},
		{150 * time.Millisecond, 0, 0, 429, 350 * time.Millisecond, 0, 0}, // 0.3 requests left
		{500 * time.Millisecond, 0, 0, 200, 0, 0, 35},
		// At 1 s the first two end and give back 20 each: 85 + 40, full.
		{time.Second, 0, 100, 200, 0, 0, 0},
		{1100 * time.Millisecond, 0, 101, 400, 0, 0, 0}, // above the burst: never
	}
	for i, st := range steps {
		v := s.judge(t0.Add(st.at), st.prompt, st.max)
		if v.status != st.status || (v.wait-st.wait).Abs() > time.Microsecond {
			t.Errorf("step %d at %v: %d, wait %v; want %d, wait %v", i, st.at, v.status, v.wait, st.status, st.wait)
		}
		if got := [2]int{int(v.left.requests.level + 1e-9), int(v.left.tokens.level + 1e-9)}; v.status != 400 && got != [2]int{st.requests, st.tok} {
			t.Errorf("step %d at %v: %.3f requests and %.3f tokens left, want %d and %d", i, st.at, v.left.requests.level, v.left.tokens.level, st.requests, st.tok)
		}
	}
	st := s.Stats()
	want := LLMStats{Arrivals: 9, Accepted: 5, Refused: 3, Invalid: 1, PromptTokens: 25, OutputTokens: 20 + 20 + 5 + 50, Reserved: 50 + 50 + 15 + 100,
		First: t0, Last: t0.Add(1100 * time.Millisecond), TokenQuota: 100 + 110}
	if st.Arrivals != want.Arrivals || st.Accepted != want.Accepted || st.Refused != want.Refused || st.Invalid != want.Invalid ||
		st.PromptTokens != want.PromptTokens || st.OutputTokens != want.OutputTokens || st.Reserved != want.Reserved ||
		!st.First.Equal(want.First) || !st.Last.Equal(want.Last) || int(st.TokenQuota+0.5) != int(want.TokenQuota) {
		t.Errorf("stats %+v\nwant  %+v", st, want)
	}
	if st.Used() != 25+95 {
		t.Errorf("used %d, want 120", st.Used())
	}
}

// The headers say each limit's burst, what is left and when it is full,
// in OpenAI's words, and upstream.OpenAI reads them.
func TestLLMHeaders(t *testing.T) {
	lv := levels{requests: limit{rate: 1, burst: 60, level: 59.5}, tokens: limit{rate: 1000, burst: 20_000, level: 14_000.7}}
	resp := &http.Response{StatusCode: 200, Header: http.Header{}}
	lv.write(resp.Header)
	want := map[string]string{
		"x-ratelimit-limit-requests": "60", "x-ratelimit-remaining-requests": "59", "x-ratelimit-reset-requests": "500ms",
		"x-ratelimit-limit-tokens": "20000", "x-ratelimit-remaining-tokens": "14000", "x-ratelimit-reset-tokens": "6s", // 5.9993 s, rounded up
	}
	for k, v := range want {
		if got := resp.Header.Get(k); got != v {
			t.Errorf("%s: %q, want %q", k, got, v)
		}
	}
	s := upstream.OpenAI.Parse(resp)
	if len(s.Unreadable) > 0 || len(s.Quotas) != 2 || s.Quotas[1].Unit != "tokens" || s.Quotas[1].Remaining != 14_000 {
		t.Errorf("upstream.OpenAI reads %+v", s)
	}
}

// Over HTTP: an answer carries OpenAI's usage, whole or in the last event
// of a stream that asked for it; a request beyond the limit is refused
// with Retry-After in whole seconds and the rate-limit headers.
func TestLLMServer(t *testing.T) {
	s := NewLLM(LLMConfig{Requests: Policy{Rate: 60, Burst: 60}, Tokens: Policy{Rate: 1, Period: time.Hour, Burst: 1000},
		Latency: 20 * time.Millisecond, MinOutput: 50, Seed: 1})
	defer s.Close()
	post := func(body string) (*http.Response, string) {
		t.Helper()
		resp, err := http.Post(s.URL(), "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	type usage struct {
		Prompt     int `json:"prompt_tokens"`
		Completion int `json:"completion_tokens"`
		Total      int `json:"total_tokens"`
	}
	var answer struct {
		Usage usage `json:"usage"`
	}
	resp, body := post(`{"prompt_tokens":100,"max_tokens":400}`)
	if err := json.Unmarshal([]byte(body), &answer); resp.StatusCode != 200 || err != nil {
		t.Fatalf("%d %v: %s", resp.StatusCode, err, body)
	}
	u := answer.Usage
	if u.Prompt != 100 || u.Completion < 200 || u.Completion > 400 || u.Total != u.Prompt+u.Completion {
		t.Errorf("usage %+v: want 100 prompt tokens and 200 to 400 of output", u)
	}
	if got, want := resp.Header.Get("x-ratelimit-remaining-tokens"), 1000-100-u.Completion; got != strconv.Itoa(want) {
		t.Errorf("after the answer, %s tokens left, want %d (the unused output given back)", got, want)
	}

	resp, body = post(`{"prompt_tokens":10,"max_tokens":40,"stream":true,"stream_options":{"include_usage":true}}`)
	if resp.Header.Get("Content-Type") != "text/event-stream" || !strings.HasSuffix(body, "data: [DONE]\n\n") {
		t.Fatalf("not a stream: %q\n%s", resp.Header.Get("Content-Type"), body)
	}
	var last string
	sc := bufio.NewScanner(strings.NewReader(body))
	for sc.Scan() {
		if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok && d != "[DONE]" {
			last = d
		}
	}
	answer.Usage = usage{}
	if err := json.Unmarshal([]byte(last), &answer); err != nil || answer.Usage.Prompt != 10 || answer.Usage.Total < 30 {
		t.Errorf("the stream's last event %s: usage %+v (%v)", last, answer.Usage, err)
	}

	resp, _ = post(`{"prompt_tokens":10,"max_tokens":990}`)
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || resp.Header.Get("x-ratelimit-remaining-tokens") == "" {
		t.Errorf("a request beyond the tokens left: %d, Retry-After %q, headers %v", resp.StatusCode, resp.Header.Get("Retry-After"), resp.Header)
	}
	if resp, _ := post(`{"prompt_tokens":10,"max_tokens":991}`); resp.StatusCode != http.StatusBadRequest {
		t.Errorf("a request beyond the burst: %d, want 400", resp.StatusCode)
	}
	st := s.Stats()
	if st.Arrivals != 4 || st.Accepted != 2 || st.Refused != 1 || st.Invalid != 1 || st.Used() != int64(u.Total+answer.Usage.Total) {
		t.Errorf("stats %+v", st)
	}
}
