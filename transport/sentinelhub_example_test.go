package transport_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/transport"
	"github.com/sluicehq/sluice/upstream"
)

// contract is an upstream's description of its own limits, shaped like
// Sentinel Hub's: each policy refills one unit every nanosBetweenRefills
// up to its capacity, counting requests or processing units.
const contract = `{"policies": [
  {"type": "REQUESTS",         "capacity": 1000,   "nanosBetweenRefills": 60000000},
  {"type": "PROCESSING_UNITS", "capacity": 1000,   "nanosBetweenRefills": 60000000},
  {"type": "PROCESSING_UNITS", "capacity": 400000, "nanosBetweenRefills": 6696000000}
]}`

// policiesOf reads a contract into the bucket's policies: requests count
// calls (unit ""), processing units count "pu".
func policiesOf(raw []byte) ([]bucket.Policy, error) {
	var c struct {
		Policies []struct {
			Type                string `json:"type"`
			Capacity            int    `json:"capacity"`
			NanosBetweenRefills int64  `json:"nanosBetweenRefills"`
		} `json:"policies"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, err
	}
	var ps []bucket.Policy
	for _, p := range c.Policies {
		units := map[string]string{"REQUESTS": "", "PROCESSING_UNITS": "pu"}
		unit, ok := units[p.Type]
		if !ok {
			return nil, fmt.Errorf("contract: unknown policy type %q", p.Type)
		}
		// The bucket refills in whole microseconds: round up, never faster
		// than the contract.
		every := (time.Duration(p.NanosBetweenRefills) + time.Microsecond - 1).Truncate(time.Microsecond)
		ps = append(ps, bucket.Policy{Unit: unit, Capacity: p.Capacity, RefillAmount: 1, RefillFrequency: every})
	}
	return ps, nil
}

// puOf is what a Process API request costs in processing units: one per
// 512 × 512 pixels of output, rounded up (a simplified rule).
func puOf(req *http.Request) int {
	w, _ := strconv.Atoi(req.URL.Query().Get("width"))
	h, _ := strconv.Atoi(req.URL.Query().Get("height"))
	return max(1, (w*h+512*512-1)/(512*512))
}

// The Sentinel Hub syncer: read the upstream's description of its limits,
// configure a bucket shared by every process from it, and send through an
// http.Client that takes each request's processing units from it and
// listens to Sentinel Hub's headers (Retry-After in milliseconds,
// X-ProcessingUnits-Remaining).
func Example_sentinelHub() {
	// Stands in for Sentinel Hub: its contract, and a Process API that
	// reports what is left.
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/contract" {
			io.WriteString(w, contract)
			return
		}
		w.Header().Set("X-RateLimit-Remaining", "999")
		w.Header().Set("X-ProcessingUnits-Remaining", "996.5")
	}))
	defer api.Close()

	resp, err := http.Get(api.URL + "/contract")
	if err != nil {
		panic(err)
	}
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		panic(err)
	}
	policies, err := policiesOf(raw)
	if err != nil {
		panic(err)
	}
	for _, p := range policies {
		fmt.Printf("unit %q: %d, 1 every %v\n", p.Unit, p.Capacity, p.RefillFrequency)
	}

	rdb := redis.NewClient(&redis.Options{Addr: exampleRedis(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	b, err := bucket.New(rdb, bucket.Config{Name: "sentinel-hub", Policies: policies})
	if err != nil {
		panic(err)
	}
	defer b.Close()
	// When the contract changes, b.SetPolicies(ctx, bucket.AsIs, policies...)
	// applies the new one to every process.

	client := transport.NewClient(b,
		transport.WithHeaders(upstream.SentinelHub),
		transport.WithEnter(func(ctx context.Context, req *http.Request) error {
			return b.EnterCost(ctx, bucket.Cost{"": 1, "pu": puOf(req)})
		}))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", api.URL+"/api/v1/process?width=1024&height=768",
		strings.NewReader(`{"input": "…"}`))
	resp, err = client.Do(req)
	if err != nil {
		panic(err)
	}
	resp.Body.Close()
	fmt.Println(resp.StatusCode, "for", puOf(req), "PU")
	// Output:
	// unit "": 1000, 1 every 60ms
	// unit "pu": 1000, 1 every 60ms
	// unit "pu": 400000, 1 every 6.696s
	// 200 for 3 PU
}
