package transport_test

import (
	"context"
	"io"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testing/upstreamtest"
	"github.com/sluicehq/sluice/local"
	"github.com/sluicehq/sluice/transport"
)

// fleet sends requests through one client from several goroutines until
// stop says so or ctx ends.
func fleet(ctx context.Context, t *testing.T, c *http.Client, url string, workers int, stop func() bool) {
	t.Helper()
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for !stop() && ctx.Err() == nil {
				req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
				resp, err := c.Do(req)
				if err != nil {
					if ctx.Err() == nil {
						t.Error(err)
					}
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
}

func client(t *testing.T, lim *local.Rate) *http.Client {
	base := &http.Transport{}
	t.Cleanup(base.CloseIdleConnections)
	return &http.Client{Transport: transport.New(base, lim)}
}

// A local.Rate at the upstream's rate: the upstream (with two requests of
// slack in its burst for the loopback's jitter) refuses nearly nothing.
func TestAtTheUpstreamsLimit(t *testing.T) {
	const rate, total = 50, 100
	up := upstreamtest.New(upstreamtest.Config{Policies: []upstreamtest.Policy{{Rate: rate, Burst: 3}}})
	defer up.Close()
	lim, err := local.NewRate(local.RateConfig{Rate: rate})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	fleet(ctx, t, client(t, lim), up.URL(), 4, func() bool { return up.Stats().Accepted >= total })
	st := up.Stats()
	if st.Accepted < total || st.Refused > 2 {
		t.Errorf("upstream accepted %d and refused %d; want %d accepted and at most 2 refused", st.Accepted, st.Refused, total)
	}
}

// The upstream announces an outage with Retry-After: once a worker hears
// it, the Rate holds every worker, those queued in it too. Only requests
// granted before the Rate heard of it may reach the upstream during the
// hold: at 10 a second, a third would need one granted 200 ms before the
// outage's first refusal to arrive after it. Without the hold each of the
// other workers sends one (each stops only at its own 503). After the
// hold, the rate holds again with no 429.
func TestOutageHoldsEveryWorker(t *testing.T) {
	const rate, workers = 10, 6
	up := upstreamtest.New(upstreamtest.Config{Policies: []upstreamtest.Policy{{Rate: rate, Burst: 3}}})
	defer up.Close()
	lim, err := local.NewRate(local.RateConfig{Rate: rate})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var once sync.Once
	fleet(ctx, t, client(t, lim), up.URL(), workers, func() bool {
		st := up.Stats()
		if st.Accepted >= 10 {
			// 1.2 s: announced as Retry-After: 2.
			once.Do(func() { up.Outage(1200 * time.Millisecond) })
		}
		return st.Refused > 0 && st.Accepted >= 20
	})

	arrivals := up.Arrivals()
	first := -1
	for i, a := range arrivals {
		if a.Status == http.StatusServiceUnavailable {
			first = i
			break
		}
	}
	if first < 0 {
		t.Fatal("the outage refused nothing")
	}
	hold := arrivals[first].At.Add(2 * time.Second)
	during, after := 0, 0
	for _, a := range arrivals[first+1:] {
		switch {
		case a.At.Before(hold):
			during++
		case a.Status != http.StatusOK:
			t.Errorf("a %d after the hold, %v after it began", a.Status, a.At.Sub(arrivals[first].At))
		default:
			after++
		}
	}
	if during > 2 {
		t.Errorf("%d requests reached the upstream during the hold, want at most 2 (granted before the Rate heard of it)", during)
	}
	if after == 0 {
		t.Error("no request after the hold")
	}
}
