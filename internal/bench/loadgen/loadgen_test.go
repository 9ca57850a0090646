package loadgen_test

import (
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

func TestMain(m *testing.M) {
	loadgen.MaybeWorker()
	goleak.VerifyTestMain(m)
}

func TestRoundTripCounter(t *testing.T) {
	srv := redistest.New(t)
	rdb := srv.Client()
	defer rdb.Close()
	var c loadgen.RoundTripCounter
	rdb.AddHook(&c)
	ctx := context.Background()
	if err := rdb.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	pipe := rdb.Pipeline()
	pipe.Set(ctx, t.Name(), 1, time.Minute)
	pipe.Incr(ctx, t.Name())
	pipe.Get(ctx, t.Name())
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	if got := c.RoundTrips(); got != 2 {
		t.Errorf("RoundTrips = %d after a command and a pipeline of 3, want 2", got)
	}
}

// TestWorkerTotals: a worker process reports its grants, then its totals,
// which count at least every round trip its callers reported.
func TestWorkerTotals(t *testing.T) {
	srv := redistest.New(t)
	cfg := bucket.Config{Name: t.Name(), Capacity: 2, RefillAmount: 1, RefillFrequency: 5 * time.Millisecond}
	spec := loadgen.Spec{Proc: 3, URL: srv.URL(), Bucket: cfg, Callers: 10, Enters: 3,
		StartAt: time.Now().Add(100 * time.Millisecond).UnixNano()}
	p, err := loadgen.Start(spec, "-test.run=^$")
	if err != nil {
		t.Fatal(err)
	}
	grants, err := p.Wait()
	if err != nil {
		t.Fatal(err)
	}
	st, ok := p.Stats()
	if !ok {
		t.Fatal("no totals reported")
	}
	if len(grants) != 30 {
		t.Fatalf("%d grants, want 30", len(grants))
	}
	var callers int64
	for _, g := range grants {
		if !g.OK() || g.Proc != 3 {
			t.Errorf("grant %+v", g)
		}
		if time.Unix(0, g.Start).Before(time.Unix(0, spec.StartAt)) {
			t.Errorf("Enter began before StartAt")
		}
		callers += int64(g.RoundTrips)
	}
	// 30 grants at 200/s cannot all come within the 20 ms lookahead:
	// callers queue and need a scheduler, whose steps come on top of the
	// callers' own round trips (fewer than they report: the bucket batches
	// concurrent arrivals into one call).
	if st.RoundTrips <= st.SchedulerSteps || st.SchedulerSteps == 0 || st.SetupRoundTrips == 0 || callers < 30 {
		t.Errorf("totals %+v; callers made %d round trips", st, callers)
	}
}
