package transport_test

import (
	"context"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testing/upstreamtest"
	"github.com/sluicehq/sluice/local"
	"github.com/sluicehq/sluice/transport"
)

// BenchmarkUpstream drives the strict test upstream (50 requests a second,
// burst 5, judged at arrival, Retry-After in whole seconds, and
// X-RateLimit-Remaining) from 4 × GOMAXPROCS goroutines through a
// local.Rate of burst 1 configured at its rate or 25 % above, with the
// Rate fed back (feedback=on: holds and syncs) or not (feedback=off: a
// refused goroutine waits out Retry-After alone). It reports the share of
// requests refused (%refused) and the upstream's utilization (accepted
// over what it allows in the run: its burst plus its rate × the run). Each op is one request, so give it a
// fixed count: -benchtime=300x is about 6 s a case.
//
// The upstream's burst of 5 leaves room for the loopback's jitter: with a
// burst of 1 at the client's exact rate, any request that arrives a
// microsecond early is refused, which half of them do.
func BenchmarkUpstream(b *testing.B) {
	const rate, burst = 50, 5
	for _, c := range []struct {
		name string
		rate int
	}{{"config=at-limit", rate}, {"config=25pct-over", rate * 5 / 4}} {
		for _, fb := range []string{"on", "off"} {
			b.Run(c.name+"/feedback="+fb, func(b *testing.B) {
				up := upstreamtest.New(upstreamtest.Config{Policies: []upstreamtest.Policy{{Rate: rate, Burst: burst}}, Remaining: true})
				defer up.Close()
				lim, err := local.NewRate(local.RateConfig{Rate: c.rate})
				if err != nil {
					b.Fatal(err)
				}
				var l interface {
					Enter(context.Context) error
					Do(context.Context, func(context.Context) error) error
				} = lim
				if fb == "off" {
					l = hidden{lim}
				}
				base := &http.Transport{MaxIdleConnsPerHost: 64}
				defer base.CloseIdleConnections()
				client := &http.Client{Transport: transport.New(base, l, transport.WithRetries(0))}
				b.SetParallelism(4) // 4 × GOMAXPROCS goroutines
				start := time.Now()
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						resp, err := client.Get(up.URL())
						if err != nil {
							b.Error(err)
							return
						}
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				})
				elapsed := time.Since(start)
				st := up.Stats()
				b.ReportMetric(100*float64(st.Refused)/float64(max(st.Accepted+st.Refused, 1)), "%refused")
				b.ReportMetric(float64(st.Accepted)/(burst+rate*elapsed.Seconds()), "utilization")
			})
		}
	}
}

// hidden is a Rate without its Feedback.
type hidden struct{ r *local.Rate }

func (h hidden) Enter(ctx context.Context) error { return h.r.Enter(ctx) }
func (h hidden) Do(ctx context.Context, fn func(context.Context) error) error {
	return h.r.Do(ctx, fn)
}

// BenchmarkRoundTrip is what the Transport adds to a request on loopback,
// with a limiter that never waits: impl=transport against impl=raw (the
// same base transport alone); compare with benchstat -col /impl.
func BenchmarkRoundTrip(b *testing.B) {
	srv := upstreamtest.New(upstreamtest.Config{})
	defer srv.Close()
	for _, impl := range []string{"transport", "raw"} {
		b.Run("impl="+impl, func(b *testing.B) {
			base := &http.Transport{}
			defer base.CloseIdleConnections()
			var rt http.RoundTripper = base
			if impl == "transport" {
				rt = transport.New(base, local.Noop{})
			}
			client := &http.Client{Transport: rt}
			b.ReportAllocs()
			for b.Loop() {
				resp, err := client.Get(srv.URL())
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
}
