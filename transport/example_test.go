package transport_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/local"
	"github.com/sluicehq/sluice/transport"
	"github.com/sluicehq/sluice/upstream"
)

// An http.Client whose requests wait their turn: at most 5 a second. A
// 429 the API answers holds every request of the limiter, and the refused
// request is sent again.
func ExampleNewClient() {
	var calls atomic.Int32
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1) == 1 {
			w.Header().Set("Retry-After", "0") // too many, try again now
			w.WriteHeader(http.StatusTooManyRequests)
			return
		}
		io.WriteString(w, "hello")
	}))
	defer api.Close()

	lim, err := local.NewRate(local.RateConfig{Rate: 5})
	if err != nil {
		panic(err)
	}
	client := transport.NewClient(lim)

	resp, err := client.Get(api.URL)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	fmt.Println(resp.StatusCode, string(body), "after", calls.Load(), "requests")
	// Output:
	// 200 hello after 2 requests
}

// Wrap an existing transport, with a cost per request and Sentinel Hub's
// headers. A request costs its size here; with a bucket.Bucket counting
// processing units, use WithEnter and bucket.Cost instead.
func ExampleNew() {
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-RateLimit-Remaining", "99")
	}))
	defer api.Close()

	lim, err := local.NewRate(local.RateConfig{Rate: 100, Period: time.Minute, Burst: 10})
	if err != nil {
		panic(err)
	}
	base := &http.Transport{MaxIdleConnsPerHost: 16}
	defer base.CloseIdleConnections()
	client := &http.Client{Transport: transport.New(base, lim,
		transport.WithCost(func(req *http.Request) int {
			n, _ := strconv.Atoi(req.Header.Get("X-Batch-Size"))
			return max(n, 1)
		}),
		transport.WithHeaders(upstream.SentinelHub),
		transport.WithRetries(1),
	)}

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", api.URL, nil)
	req.Header.Set("X-Batch-Size", "4")
	resp, err := client.Do(req)
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode)
	// Output:
	// 200
}
