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
	// sluice_requests_total{sluice_limiter_kind="bucket",sluice_limiter_name="example-prometheus",sluice_reason="",sluice_result="granted"} 3
	// sluice_requests_total{sluice_limiter_kind="bucket",sluice_limiter_name="example-prometheus",sluice_reason="wait_too_long",sluice_result="refused"} 1
}
