package bucket_test

import (
	"context"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/internal/testing/upstreamtest"
	"github.com/sluicehq/sluice/upstream"
)

// rateOf is a policy's refill rate, per second.
func rateOf(p bucket.Policy) float64 { return float64(p.RefillAmount) / p.RefillFrequency.Seconds() }

// TestAdaptStepsToSaidRate: with Adapt, one refusal whose quota says the
// upstream's rate (OpenAI's words: 20 at most, none left, full again in
// 200 ms) steps the rate in force straight to it, for every process, and
// holds every caller until a request is back (10 ms), not for the whole
// second Retry-After rounds up to. A refusal at a rate in force within
// what the quota says does not step.
func TestAdaptStepsToSaidRate(t *testing.T) {
	srv := redistest.New(t)
	rdb := srv.Client()
	defer rdb.Close()
	cfg := bucket.Config{Name: t.Name(), Capacity: 20, RefillAmount: 1, RefillFrequency: 8 * time.Millisecond, Adapt: true} // 125 a second
	a := newBucket(t, rdb, cfg)
	other := srv.Client()
	defer other.Close()
	b := newBucket(t, other, cfg)
	ctx := withTimeout(t, 20*time.Second)

	resp := &http.Response{StatusCode: http.StatusTooManyRequests, Header: http.Header{
		"Retry-After":                    {"1"},
		"X-Ratelimit-Limit-Requests":     {"20"},
		"X-Ratelimit-Remaining-Requests": {"0"},
		"X-Ratelimit-Reset-Requests":     {"200ms"},
	}}
	refused := upstream.OpenAI.Parse(resp)
	if err := a.Feedback(ctx, refused); err != nil {
		t.Fatal(err)
	}
	ps, err := b.Policies(ctx)
	if err != nil || len(ps) != 1 {
		t.Fatalf("Limits = %v, %v", ps, err)
	}
	// 19 requests (one less than 20 − 0: Remaining is rounded down) in
	// 200 ms: 95 a second, within a microsecond of the period.
	if r := rateOf(ps[0]); r < 94.99 || r > 95.01 {
		t.Errorf("after one refusal the rate in force is %.2f a second, want the 95 the quota says (the old rule: 125 × 0.85 = 106)", r)
	}
	in, err := b.Inspect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if held := time.Until(in.HeldUntil); held > 100*time.Millisecond {
		t.Errorf("held for %v more: want until a request is back (10 ms), not the Retry-After's second", held)
	}
	start := time.Now()
	if err := b.Enter(ctx); err != nil {
		t.Fatal(err)
	}
	if d := time.Since(start); d > 500*time.Millisecond {
		t.Errorf("the next caller started %v after the refusal; want within the 10 ms hold and a period", d)
	}

	// A refusal at a rate in force within what the upstream says (full
	// again in 150 ms: 126 a second, for a bucket configured at 100) is
	// not for the rate: no step, and the same short hold.
	within := cfg
	within.Name, within.RefillFrequency = t.Name()+"-within", 10*time.Millisecond
	c := newBucket(t, rdb, within)
	resp.Header.Set("X-Ratelimit-Reset-Requests", "150ms")
	if err := c.Feedback(ctx, upstream.OpenAI.Parse(resp)); err != nil {
		t.Fatal(err)
	}
	if in, err := c.Inspect(ctx); err != nil || in.Adapting != 0 || time.Until(in.HeldUntil) > 100*time.Millisecond {
		t.Errorf("after a refusal within the said rate: %+v, %v; want the configured rate and a hold of 8 ms", in, err)
	}
}

// TestAdaptSaidRateUnderLoad: callers configured 25 % above a strict
// upstream that answers in OpenAI's words, each feeding every answer back
// as package transport does. Adapt steps to the upstream's rate in the
// first refusal, the refusals stay few, the upstream's quota is used, and
// every grant keeps the bucket's own promise (the configured limit: Adapt
// only slows it).
func TestAdaptSaidRateUnderLoad(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	up := upstreamtest.NewOpenAI(upstreamtest.Config{Policies: []upstreamtest.Policy{{Rate: 100, Burst: 20}}})
	defer up.Close()
	cfg := bucket.Config{Name: t.Name(), Capacity: 20, RefillAmount: 1, RefillFrequency: 8 * time.Millisecond, Adapt: true}
	b := newBucket(t, rdb, cfg)
	ctx := withTimeout(t, 30*time.Second)
	run, stop := context.WithTimeout(ctx, 4*time.Second)
	defer stop()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	defer client.CloseIdleConnections()

	var (
		mu       sync.Mutex
		grants   []loadgen.Grant
		slowest  float64 // the least rate in force seen after a refusal
		failures []error
		wg       sync.WaitGroup
	)
	for range 16 {
		wg.Go(func() {
			for run.Err() == nil {
				start := time.Now()
				rep, err := enterReport(run, b)
				back := time.Now() // before mu, which every caller shares
				if err != nil {
					// Failures at the run's end are its deadline's, which a
					// loaded machine may report a moment late (as saturate),
					// or refusals of callers whose turn comes after it.
					if end, _ := run.Deadline(); run.Err() == nil && time.Until(end) > 100*time.Millisecond && !refusedForDeadline(err) {
						mu.Lock()
						failures = append(failures, err)
						mu.Unlock()
					}
					return
				}
				mu.Lock()
				grants = append(grants, loadgen.Grant{Start: start.UnixNano(), End: back.UnixNano(), Slot: rep.Slot.UnixMicro(), Ticket: rep.Ticket})
				mu.Unlock()
				req, _ := http.NewRequestWithContext(ctx, "GET", up.URL(), nil)
				resp, err := client.Do(req)
				if err != nil {
					mu.Lock()
					failures = append(failures, err)
					mu.Unlock()
					return
				}
				resp.Body.Close()
				s := upstream.OpenAI.Parse(resp)
				if err := b.Feedback(ctx, s); err != nil {
					mu.Lock()
					failures = append(failures, err)
					mu.Unlock()
					return
				}
				if s.Refused {
					if ps, err := b.Policies(ctx); err == nil {
						mu.Lock()
						if r := rateOf(ps[0]); slowest == 0 || r < slowest {
							slowest = r
						}
						mu.Unlock()
					}
				}
			}
		})
	}
	wg.Wait()
	if len(failures) > 0 {
		t.Fatalf("%d failures, first: %v", len(failures), failures[0])
	}
	checkGrants(t, grants, cfg)

	st, arr := up.Stats(), up.Arrivals()
	span := arr[len(arr)-1].At.Sub(arr[0].At)
	used := float64(st.Accepted) / (20 + 100*span.Seconds())
	t.Logf("%d accepted, %d refused in %v: %.3f of the upstream's quota; the least rate in force %.1f a second", st.Accepted, st.Refused, span, used, slowest)
	// The first refusal comes at once (both start full, the bucket 25 %
	// faster), with the requests already on their way; after the step to
	// the said rate, which the quota's rounding puts at most 1/20 under
	// the upstream's, few more. The old rule stepped to 106 a second and
	// held a second per refusal: about 0.6 of the quota in 4 s.
	if slowest < 90 || slowest > 100 {
		t.Errorf("the rate in force after a refusal went down to %.1f a second; want the upstream's 100 or up to 1/20 under", slowest)
	}
	if st.Refused > 12 {
		t.Errorf("%d refused of %d: the fleet kept going above the upstream's rate", st.Refused, st.Accepted+st.Refused)
	}
	if used < 0.8 {
		t.Errorf("%.3f of the upstream's quota used in %v; want ≥ 0.8 (holds of a request's return, not of a second)", used, span)
	}
}
