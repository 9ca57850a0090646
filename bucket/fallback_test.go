package bucket_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/guarantee"
	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/testkit"
)

// localGrants records each granted call's return and whether the local
// share admitted it, through the Observer as a user would read it.
type localGrants struct {
	mu     sync.Mutex
	at     []time.Time
	local  []bool
	failed []error
	nLocal atomic.Int64
}

func (g *localGrants) Observe(e sluice.Event) {
	if e.Result != sluice.Granted {
		return
	}
	g.mu.Lock()
	g.at = append(g.at, time.Now())
	g.local = append(g.local, e.Local)
	g.mu.Unlock()
	if e.Local {
		g.nLocal.Add(1)
	}
}

// between counts the grants in [from, to), and those of them local.
func (g *localGrants) between(from, to time.Time) (all, local int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, t := range g.at {
		if !t.Before(from) && t.Before(to) {
			all++
			if g.local[i] {
				local++
			}
		}
	}
	return all, local
}

// TestLocalShareOutage: callers saturating a bucket with LocalShare keep
// being admitted while Redis is killed (and restarted empty) or frozen
// (and thawed), at about the limit, and go back to Redis at its first
// answer; over the whole run no window holds more than the bucket's
// promise plus one Capacity (the switch), start times judged with the
// lateness they may have. No call fails.
func TestLocalShareOutage(t *testing.T) {
	for _, fault := range []string{testkit.Killed, testkit.Frozen} {
		t.Run(fault, func(t *testing.T) {
			srv := redistest.New(t)
			srv.RequireReal(t)
			rdb := srv.Client()
			defer rdb.Close()
			g := &localGrants{}
			cfg := bucket.Config{Name: t.Name(), Capacity: 20, RefillAmount: 1, RefillFrequency: 5 * time.Millisecond, Fallback: bucket.LocalShare, Observer: g}
			b := newBucket(t, rdb, cfg)
			ctx, stop := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			var failures atomic.Int64
			var firstErr atomic.Value
			for range 20 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for ctx.Err() == nil {
						cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
						err := b.Enter(cctx)
						cancel()
						if err != nil && ctx.Err() == nil {
							failures.Add(1)
							firstErr.CompareAndSwap(nil, err)
						}
					}
				}()
			}
			defer func() { stop(); wg.Wait() }()
			time.Sleep(time.Second) // saturated on Redis: the trace is read
			faultAt := time.Now()
			before := g.nLocal.Load()
			if fault == testkit.Killed {
				if err := srv.Kill(); err != nil {
					t.Fatal(err)
				}
			} else {
				if err := srv.Pause(); err != nil {
					t.Fatal(err)
				}
			}
			testkit.WaitFor(t, 5*time.Second, "a grant from the local share", func() bool { return g.nLocal.Load() > before })
			t.Logf("first local grant %v after Redis was %s", time.Since(faultAt).Round(time.Millisecond), fault)
			time.Sleep(1500 * time.Millisecond)
			backAt := time.Now()
			if fault == testkit.Killed {
				if err := srv.Restart(); err != nil {
					t.Fatal(err)
				}
			} else {
				if err := srv.Resume(); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(1500 * time.Millisecond)
			stop()
			wg.Wait()
			end := time.Now()

			all, local := g.between(faultAt.Add(500*time.Millisecond), backAt)
			want := 200 * backAt.Sub(faultAt.Add(500*time.Millisecond)).Seconds()
			t.Logf("outage (from 500 ms in): %d grants, %d local, %.0f allowed", all, local, want)
			if float64(local) < 0.6*want {
				t.Errorf("outage: %d local grants, want ≥ 0.6 × %.0f", local, want)
			}
			after, afterLocal := g.between(backAt.Add(500*time.Millisecond), end)
			t.Logf("after the return (from 500 ms in): %d grants, %d local", after, afterLocal)
			if afterLocal > 0 || after == 0 {
				t.Errorf("after the return: %d grants, %d of them local, want all from Redis", after, afterLocal)
			}
			if n := failures.Load(); n > 0 {
				t.Errorf("%d calls failed; the first: %v", n, firstErr.Load())
			}
			g.mu.Lock()
			grants := append([]time.Time(nil), g.at...)
			g.mu.Unlock()
			l := limitOf(cfg)
			l.Capacity *= 2 // the promise plus one Capacity for the switch
			if r := guarantee.CheckSlack(grants, l, 30*time.Millisecond); !r.OK() {
				t.Errorf("promise + one Capacity broken: %v", r)
			}
		})
	}
}

// TestLocalShareUnknown: a process that has not reached Redis since it
// started knows no share: it fails as without a fallback, in the bound.
func TestLocalShareUnknown(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	rdb := srv.Client()
	defer rdb.Close()
	b := newBucket(t, rdb, bucket.Config{Name: t.Name(), Capacity: 5, RefillAmount: 1, RefillFrequency: 10 * time.Millisecond, Fallback: bucket.LocalShare})
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := b.Enter(context.Background())
	if took := time.Since(start); took > unreachableBound+hangMargin {
		t.Errorf("Enter returned after %v", took)
	}
	testkit.CheckUnreachable(t, "Enter", err, srv.Addr(), testkit.Refused)
}

// TestLocalShareConfig: a fallback New cannot serve is refused by name.
func TestLocalShareConfig(t *testing.T) {
	srv := redistest.New(t)
	rdb := srv.Client()
	defer rdb.Close()
	for _, c := range []struct {
		cfg  bucket.Config
		want string
	}{
		{bucket.Config{Name: "a", Capacity: 5, RefillAmount: 1, RefillFrequency: time.Millisecond, Fallback: 7}, "Fallback 7"},
		{bucket.Config{Name: "a", Capacity: 5, RefillAmount: 1, RefillFrequency: time.Millisecond, Fallback: bucket.LocalShare,
			Policies: []bucket.Policy{bucket.Rolling(100, time.Minute)}}, "Policies[0] a RollingWindow"},
	} {
		_, err := bucket.New(rdb, c.cfg)
		if !errors.Is(err, bucket.ErrConfig) || !contains(err.Error(), c.want) {
			t.Errorf("New(%+v): %v, want ErrConfig saying %q", c.cfg, err, c.want)
		}
	}
}
