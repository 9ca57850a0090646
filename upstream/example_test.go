package upstream_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"

	"github.com/sluicehq/sluice/upstream"
)

// Read what an API said about its limits after a request.
func ExampleParse() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Retry-After", "2")
		w.Header().Set("X-RateLimit-Limit", "100")
		w.Header().Set("X-RateLimit-Remaining", "0")
		w.Header().Set("X-RateLimit-Reset", "30")
		w.WriteHeader(http.StatusTooManyRequests)
	}))
	defer api.Close()

	resp, err := http.Get(api.URL)
	if err != nil {
		panic(err)
	}
	resp.Body.Close()

	s := upstream.Parse(resp)
	fmt.Println("refused:", s.Refused, "retry after:", s.RetryAfter)
	for _, q := range s.Quotas {
		fmt.Printf("%d of %d left, reset in %v\n", q.Remaining, q.Limit, q.Reset)
	}
	// Output:
	// refused: true retry after: 2s
	// 0 of 100 left, reset in 30s
}

// Sentinel Hub sends its waits in milliseconds and counts processing units:
// the SentinelHub header set reads them.
func ExampleHeaders_Parse_sentinelHub() {
	resp := &http.Response{StatusCode: http.StatusTooManyRequests, Header: http.Header{
		"Retry-After":                 {"1500"},
		"X-Ratelimit-Remaining":       {"12"},
		"X-Processingunits-Remaining": {"0.75"},
	}}
	s := upstream.SentinelHub.Parse(resp)
	fmt.Println("retry after:", s.RetryAfter)
	for _, q := range s.Quotas {
		fmt.Printf("unit %q: %d left\n", q.Unit, q.Remaining)
	}
	// Output:
	// retry after: 1.5s
	// unit "": 12 left
	// unit "pu": 0 left
}

// OpenAI's resets are the time until a quota is full again at its steady
// rate: the OpenAI set marks its quotas UntilFull, and counts tokens in
// unit "tokens".
func ExampleHeaders_Parse_openAI() {
	resp := &http.Response{StatusCode: http.StatusOK, Header: http.Header{
		"X-Ratelimit-Limit-Requests":     {"60"},
		"X-Ratelimit-Remaining-Requests": {"59"},
		"X-Ratelimit-Reset-Requests":     {"1s"},
		"X-Ratelimit-Limit-Tokens":       {"150000"},
		"X-Ratelimit-Remaining-Tokens":   {"149984"},
		"X-Ratelimit-Reset-Tokens":       {"6m0s"},
	}}
	for _, q := range upstream.OpenAI.Parse(resp).Quotas {
		fmt.Printf("unit %q: %d of %d left, full in %v (until full: %v)\n", q.Unit, q.Remaining, q.Limit, q.Reset, q.UntilFull)
	}
	// Output:
	// unit "": 59 of 60 left, full in 1s (until full: true)
	// unit "tokens": 149984 of 150000 left, full in 6m0s (until full: true)
}

// An API with its own header names: build a set, or copy one and change
// it. A header it names that comes with a value Parse cannot read is
// listed in Unreadable.
func ExampleHeaders() {
	h := upstream.Headers{
		RetryAfter: []upstream.Delay{{Name: "Retry-After"}},
		Counters: []upstream.Counter{{
			Unit:      "credits",
			Limit:     "X-Credits-Limit",
			Remaining: "X-Credits-Remaining",
			Reset:     "X-Credits-Reset", // an RFC 3339 timestamp, against Date
		}},
	}
	resp := &http.Response{StatusCode: http.StatusTooManyRequests, Header: http.Header{
		"Date":                {"Fri, 14 Mar 2025 15:09:26 GMT"},
		"Retry-After":         {"in a minute"},
		"X-Credits-Limit":     {"1000"},
		"X-Credits-Remaining": {"0"},
		"X-Credits-Reset":     {"2025-03-14T15:10:26Z"},
	}}
	s := h.Parse(resp)
	for _, q := range s.Quotas {
		fmt.Printf("unit %q: %d of %d left, reset in %v\n", q.Unit, q.Remaining, q.Limit, q.Reset)
	}
	for _, f := range s.Unreadable {
		fmt.Printf("unreadable %s: %q\n", f.Name, f.Value)
	}
	// Output:
	// unit "credits": 0 of 1000 left, reset in 1m0s
	// unreadable Retry-After: "in a minute"
}
