package sluiceprometheus_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/metrics/sluiceprometheus"
)

// Example registers a Collector, makes it a bucket's Observer and tracks
// the bucket, then reads /metrics as Prometheus would. A real
// application registers with prometheus.MustRegister and serves
// promhttp.Handler on its own port.
func Example() {
	metrics := sluiceprometheus.New()
	registry := prometheus.NewRegistry()
	registry.MustRegister(metrics)

	rdb := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	b, err := bucket.New(rdb, bucket.Config{
		Name:            "example-prometheus",
		Capacity:        3,
		RefillAmount:    1,
		RefillFrequency: time.Minute,
		MaxWait:         time.Second, // refuse a caller that would wait longer
		Observer:        metrics,     // every call to enter is recorded
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()
	defer metrics.Track("bucket", "example-prometheus", b)() // callers waiting, scheduler steps

	ctx := context.Background()
	for range 4 { // three grants; the fourth would wait a minute, more than MaxWait
		if err := b.Enter(ctx); err != nil && !errors.Is(err, sluice.ErrWaitTooLong) {
			fmt.Println(err)
			return
		}
	}

	srv := httptest.NewServer(promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/metrics")
	if err != nil {
		fmt.Println(err)
		return
	}
	defer resp.Body.Close()
	lines := bufio.NewScanner(resp.Body)
	for lines.Scan() {
		if l := lines.Text(); strings.HasPrefix(l, "sluice_requests_total") {
			fmt.Println(l)
		}
	}
	// Output:
	// sluice_requests_total{sluice_lane="",sluice_limiter_kind="bucket",sluice_limiter_name="example-prometheus",sluice_reason="",sluice_result="granted"} 3
	// sluice_requests_total{sluice_lane="",sluice_limiter_kind="bucket",sluice_limiter_name="example-prometheus",sluice_reason="wait_too_long",sluice_result="refused"} 1
}

// ExampleWithTopLanes: a bucket with a lane per tenant labels its
// requests by lane, at most 2 lanes by name here (20 by default): the
// other tenants count as "other", and the default lane's label is "".
func ExampleWithTopLanes() {
	metrics := sluiceprometheus.New(sluiceprometheus.WithTopLanes(2))
	registry := prometheus.NewRegistry()
	registry.MustRegister(metrics)

	rdb := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	b, err := bucket.New(rdb, bucket.Config{Name: "example-prometheus-lanes", Capacity: 1000, RefillAmount: 1000, RefillFrequency: time.Minute, Observer: metrics})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer b.Close()

	ctx := context.Background()
	for _, tenant := range []string{"acme", "globex", "initech", "umbrella"} {
		if err := b.Enter(bucket.WithLane(ctx, tenant)); err != nil {
			fmt.Println(err)
			return
		}
	}
	if err := b.Enter(ctx); err != nil { // the default lane
		fmt.Println(err)
		return
	}

	families, err := registry.Gather()
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, f := range families {
		if f.GetName() != "sluice_requests_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "sluice_lane" {
					fmt.Printf("lane %q: %v\n", l.GetValue(), m.GetCounter().GetValue())
				}
			}
		}
	}
	// Output:
	// lane "": 1
	// lane "acme": 1
	// lane "globex": 1
	// lane "other": 2
}
