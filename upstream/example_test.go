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

// An API with its own header names: copy a set and change it.
func ExampleHeaders() {
	h := upstream.Headers{
		RetryAfter: []upstream.Delay{{Name: "Retry-After"}},
		Counters: []upstream.Counter{{
			Unit:      "tokens",
			Limit:     "X-RateLimit-Limit-Tokens",
			Remaining: "X-RateLimit-Remaining-Tokens",
			Reset:     "X-RateLimit-Reset-Tokens", // "6m0s": a Go duration is read too
		}},
	}
	resp := &http.Response{StatusCode: http.StatusOK, Header: http.Header{
		"X-Ratelimit-Limit-Tokens":     {"150000"},
		"X-Ratelimit-Remaining-Tokens": {"149984"},
		"X-Ratelimit-Reset-Tokens":     {"6ms"},
	}}
	fmt.Printf("%+v\n", h.Parse(resp).Quotas)
	// Output:
	// [{Unit:tokens Policy: Limit:150000 Remaining:149984 Reset:6ms Window:0s}]
}
