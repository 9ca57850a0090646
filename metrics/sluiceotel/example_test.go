package sluiceotel_test

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
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/metrics/sluiceotel"
)

// Example wires a bucket's metrics to Prometheus through OpenTelemetry:
// the SDK's MeterProvider reads through the Prometheus exporter, which
// serves them on /metrics. A real application would keep the provider
// for its lifetime and serve promhttp on its own port.
func Example() {
	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry), otelprom.WithoutScopeInfo(), otelprom.WithoutTargetInfo())
	if err != nil {
		fmt.Println(err)
		return
	}
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter))
	defer mp.Shutdown(context.Background())
	metrics, err := sluiceotel.New(mp)
	if err != nil {
		fmt.Println(err)
		return
	}

	rdb := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	b, err := bucket.New(rdb, bucket.Config{
		Name:            "example-metrics",
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
	stop, err := metrics.Track("bucket", "example-metrics", b) // callers waiting, scheduler steps
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()

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
		if l := lines.Text(); strings.HasPrefix(l, "sluice_requests_total") || strings.HasPrefix(l, "sluice_queued_requests") {
			fmt.Println(l)
		}
	}
	// Output:
	// sluice_queued_requests{sluice_limiter_kind="bucket",sluice_limiter_name="example-metrics"} 0
	// sluice_requests_total{sluice_limiter_kind="bucket",sluice_limiter_name="example-metrics",sluice_result="granted"} 3
	// sluice_requests_total{sluice_limiter_kind="bucket",sluice_limiter_name="example-metrics",sluice_reason="wait_too_long",sluice_result="refused"} 1
}
