package bucket_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/internal/testing/testkit"
)

// localGrants records each granted call's return and whether the local
// share admitted it, through the Observer as a user would read it.
type localGrants struct {
	mu     sync.Mutex
	at     []time.Time
	local  []bool
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
			var logMu sync.Mutex
			var logged strings.Builder
			logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
				logMu.Lock()
				defer logMu.Unlock()
				return logged.Write(p)
			}), nil))
			cfg := bucket.Config{Name: t.Name(), Capacity: 20, RefillAmount: 1, RefillFrequency: 5 * time.Millisecond, Fallback: bucket.LocalShare, Observer: g, Logger: logger}
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
			ictx, icancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			in, err := b.Inspect(ictx)
			icancel()
			if err == nil || !in.Local || in.LocalShare != 1 || in.LocalSince.Before(faultAt) {
				t.Errorf("Inspect during the outage: %v, Local %v since %v of 1/%d; want an error, and Local since the fault of 1/1", err, in.Local, in.LocalSince, in.LocalShare)
			}
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
			// go-redis dials a server that refused it again only once a
			// second, so the first answer may come that late.
			testkit.WaitFor(t, 5*time.Second, "the return to Redis", func() bool {
				in, err := b.Inspect(context.Background())
				return err == nil && !in.Local
			})
			t.Logf("back on Redis %v after it was up", time.Since(backAt).Round(time.Millisecond))
			returned := time.Now()
			time.Sleep(time.Second)
			stop()
			wg.Wait()
			end := time.Now()

			all, local := g.between(faultAt.Add(500*time.Millisecond), backAt)
			want := 200 * backAt.Sub(faultAt.Add(500*time.Millisecond)).Seconds()
			t.Logf("outage (from 500 ms in): %d grants, %d local, %.0f allowed", all, local, want)
			if float64(local) < 0.6*want {
				t.Errorf("outage: %d local grants, want ≥ 0.6 × %.0f", local, want)
			}
			after, afterLocal := g.between(returned.Add(100*time.Millisecond), end)
			t.Logf("after the return (from 100 ms in): %d grants, %d local", after, afterLocal)
			if afterLocal > 0 || after == 0 {
				t.Errorf("after the return: %d grants, %d of them local, want all from Redis", after, afterLocal)
			}
			if in, err := b.Inspect(context.Background()); err != nil || in.Local {
				t.Errorf("Inspect after the return: %v, Local %v", err, in.Local)
			}
			logMu.Lock()
			text := logged.String()
			logMu.Unlock()
			t.Logf("logged:\n%s", text)
			if n, m := strings.Count(text, "local share, 1/1 of the limit"), strings.Count(text, "back on Redis after"); n != 1 || m != 1 {
				t.Errorf("logged %d switches to the local share and %d returns, want one each:\n%s", n, m, text)
			}
			if n := failures.Load(); n > 0 {
				t.Errorf("%d calls failed; the first: %v", n, firstErr.Load())
			}
			g.mu.Lock()
			grants := append([]time.Time(nil), g.at...)
			g.mu.Unlock()
			checkSwitchBound(t, grants, cfg)
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
		if !errors.Is(err, sluice.ErrConfig) || !contains(err.Error(), c.want) {
			t.Errorf("New(%+v): %v, want ErrConfig saying %q", c.cfg, err, c.want)
		}
	}
}

// TestLocalShareFleet: four processes saturate a bucket with LocalShare;
// Redis is killed and restarted empty 1.5 s later. During the outage each
// process admits about a quarter of the limit (the fleet about all of
// it), after the restart they are back on Redis, and over the whole run,
// judged over every grant of every process, no window holds more than the
// promise plus one Capacity: the restarted bucket starts from what the
// shares granted, not full.
func TestLocalShareFleet(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	cfg := bucket.Config{Name: t.Name(), Capacity: 20, RefillAmount: 1, RefillFrequency: 5 * time.Millisecond, Fallback: bucket.LocalShare}
	const procs = 4
	start := time.Now().Add(2 * time.Second)
	var ps []*loadgen.Proc
	for i := range procs {
		ps = append(ps, startWorker(t, loadgen.Spec{Proc: i, Addr: srv.Addr(), Bucket: cfg, Callers: 10, Until: 4500 * time.Millisecond,
			Timeout: 2 * time.Second, Backoff: 50 * time.Millisecond, QuietRedis: true, StartAt: start.UnixNano()}))
	}
	time.Sleep(time.Until(start.Add(1500 * time.Millisecond))) // every process has traced
	killAt := time.Now()
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	backAt := time.Now()
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	var all []loadgen.Grant
	for _, p := range ps {
		all = append(all, wait(t, p)...)
	}
	var grants []time.Time
	failed := 0
	outage := map[int]int{}
	var outageAll, after, afterLocal int
	from, to := killAt.Add(300*time.Millisecond), backAt
	for _, g := range all {
		if !g.OK() {
			failed++
			continue
		}
		at := g.Time()
		grants = append(grants, at)
		switch {
		case !at.Before(from) && at.Before(to):
			outageAll++
			if g.Local {
				outage[g.Proc]++
			}
		case at.After(backAt.Add(500 * time.Millisecond)):
			after++
			if g.Local {
				afterLocal++
			}
		}
	}
	want := 200 * to.Sub(from).Seconds()
	t.Logf("outage (from 300 ms in): %d grants, local by process %v, %.0f allowed; after the return (from 500 ms in): %d grants, %d local; %d failed",
		outageAll, outage, want, after, afterLocal, failed)
	local := 0
	for i := range procs {
		local += outage[i]
		if float64(outage[i]) < 0.6*want/procs {
			t.Errorf("process %d: %d local grants in the outage, want ≥ 0.6 × its share %.0f", i, outage[i], want/procs)
		}
	}
	if float64(local) > 1.1*want+float64(cfg.Capacity) {
		t.Errorf("the fleet's shares granted %d in the outage, above the %.0f allowed plus a Capacity", local, want)
	}
	if after == 0 || afterLocal > 0 {
		t.Errorf("after the return: %d grants, %d local, want all from Redis", after, afterLocal)
	}
	if failed > 0 {
		t.Errorf("%d calls failed", failed)
	}
	checkSwitchBound(t, grants, cfg)
}

// checkSwitchBound fails t when a window of grants (start times, which
// may each lag their slot by MaxLateness and a scheduling hiccup) holds
// more than the bucket's promise plus one Capacity, the switch's.
func checkSwitchBound(t *testing.T, grants []time.Time, cfg bucket.Config) {
	t.Helper()
	l := limitOf(cfg)
	l.Capacity *= 2
	if r := guarantee.CheckSlack(grants, l, 30*time.Millisecond); !r.OK() {
		t.Errorf("promise + one Capacity broken over all grants: %v", r)
	}
}

// TestLocalShareNotForErrors: a Redis that answers with an error (out of
// memory) fails the call with its words; it is no reason to switch.
func TestLocalShareNotForErrors(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	rdb := srv.Client()
	defer rdb.Close()
	b := newBucket(t, rdb, bucket.Config{Name: t.Name(), Capacity: 5, RefillAmount: 1, RefillFrequency: 10 * time.Millisecond, Fallback: bucket.LocalShare})
	ctx := withTimeout(t, 10*time.Second)
	if err := b.Enter(ctx); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory-policy", "noeviction").Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.ConfigSet(ctx, "maxmemory", "1").Err(); err != nil {
		t.Fatal(err)
	}
	defer rdb.ConfigSet(context.Background(), "maxmemory", "0")
	rep, err := b.EnterReport(ctx)
	if err == nil || !contains(err.Error(), "OOM") || rep.Local {
		t.Errorf("Enter against a Redis out of memory: %v (local %v), want its OOM error, not the local share", err, rep.Local)
	}
	if in, _ := b.Inspect(ctx); in.Local {
		t.Error("the bucket switched to its local share on an error reply")
	}
}

// TestLocalShareKeepsOrder: callers queued in Redis when it goes away
// are served by the local share in their arrival order. Their local slots
// are 400 ms apart: a caller whose poll was in flight to the frozen Redis
// comes back from it only at the call's bound (250 ms) and the probe's
// verdict, and starts that late.
func TestLocalShareKeepsOrder(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	rdb := srv.Client()
	defer rdb.Close()
	cfg := bucket.Config{Name: t.Name(), Capacity: 1, RefillAmount: 1, RefillFrequency: 400 * time.Millisecond, Fallback: bucket.LocalShare}
	b := newBucket(t, rdb, cfg)
	ctx := withTimeout(t, 30*time.Second)
	if err := b.Enter(ctx); err != nil { // the trace is read, the bucket empty
		t.Fatal(err)
	}
	testkit.WaitFor(t, 5*time.Second, "the presence trace", func() bool {
		return rdb.ZCard(ctx, "sluice:{"+t.Name()+"}:procs").Val() == 1
	})
	const callers = 6
	type result struct {
		i   int // the order the callers were started in
		rep bucket.Report
		err error
		at  time.Time
	}
	results := make(chan result, callers)
	for i := range callers {
		go func() {
			rep, err := b.EnterReport(ctx)
			results <- result{i, rep, err, time.Now()}
		}()
		// One at a time, so that tickets follow i.
		testkit.WaitFor(t, 5*time.Second, "the caller to queue", func() bool {
			return rdb.LLen(ctx, "sluice:{"+t.Name()+"}:queue").Val() >= int64(i+1) || len(results) > 0
		})
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	defer srv.Resume()
	var got []result
	for range callers {
		r := <-results
		if r.err != nil {
			t.Fatalf("a queued caller failed: %v", r.err)
		}
		got = append(got, r)
	}
	// The callers with a ticket return in its order. One without (0) is
	// the last started, whose arrival's reply Redis had not yet written
	// when the test paused it (a busy host; seen once beside a busy
	// loop): its arrival is the latest, and it returns after every caller
	// with a ticket.
	local := 0
	var prev *result
	ticketless := false
	for k, r := range got {
		if r.rep.Local {
			local++
		}
		if r.rep.Ticket == 0 {
			if r.i != callers-1 {
				t.Errorf("caller %d of %d returned without a ticket: only the last started may lack one", r.i, callers)
			}
			ticketless = true
			continue
		}
		if ticketless {
			t.Errorf("ticket %d returned at %v, after a caller without a ticket (the latest arrival)", r.rep.Ticket, r.at.Format("15:04:05.000"))
		}
		if prev != nil && r.rep.Ticket < prev.rep.Ticket {
			t.Errorf("ticket %d returned at %v, before ticket %d (%v): not in arrival order", prev.rep.Ticket, prev.at.Format("15:04:05.000"), r.rep.Ticket, r.at.Format("15:04:05.000"))
		}
		prev = &got[k]
	}
	t.Logf("%d of %d queued callers served by the local share", local, callers)
	if local < callers/2 {
		t.Errorf("%d of %d queued callers served locally, want most", local, callers)
	}
}
