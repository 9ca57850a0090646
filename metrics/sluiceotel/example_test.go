package sluiceotel_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

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

// ExampleWithTopLanes: a bucket with a lane per tenant records its
// requests by lane, at most 2 lanes by name here (20 by default): the
// other tenants count as "other", and the default lane has no sluice.lane.
func ExampleWithTopLanes() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer mp.Shutdown(context.Background())
	metrics, err := sluiceotel.New(mp, sluiceotel.WithTopLanes(2))
	if err != nil {
		fmt.Println(err)
		return
	}

	rdb := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	b, err := bucket.New(rdb, bucket.Config{Name: "example-otel-lanes", Capacity: 1000, RefillAmount: 1000, RefillFrequency: time.Minute, Observer: metrics})
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

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		fmt.Println(err)
		return
	}
	var lines []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "sluice.requests" {
				continue
			}
			for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
				lane, _ := p.Attributes.Value(sluiceotel.LaneKey)
				lines = append(lines, fmt.Sprintf("lane %q: %d", lane.AsString(), p.Value))
			}
		}
	}
	slices.Sort(lines)
	fmt.Println(strings.Join(lines, "\n"))
	// Output:
	// lane "": 1
	// lane "acme": 1
	// lane "globex": 1
	// lane "other": 2
}
