package transport_test

import (
	"context"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/internal/testing/upstreamtest"
	"github.com/sluicehq/sluice/transport"
)

// fleetOf returns n clients as n processes would have them: each its own
// Redis connection pool, *bucket.Bucket on the same bucket, and HTTP
// transport.
func fleetOf(t *testing.T, addr string, n int, cfg bucket.Config) []*http.Client {
	t.Helper()
	var cs []*http.Client
	for range n {
		rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { rdb.Close() })
		b, err := bucket.New(rdb, cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Close() })
		base := &http.Transport{}
		t.Cleanup(base.CloseIdleConnections)
		cs = append(cs, &http.Client{Transport: transport.New(base, b)})
	}
	return cs
}

// sendAll runs workers goroutines on each client until stop says so.
func sendAll(ctx context.Context, t *testing.T, cs []*http.Client, url string, workers int, stop func() bool) {
	var wg sync.WaitGroup
	for _, c := range cs {
		wg.Go(func() { fleet(ctx, t, c, url, workers, stop) })
	}
	wg.Wait()
}

// Two buckets on separate clients, as two processes, at the upstream's
// rate with a capacity one below its burst: the upstream refuses nearly
// nothing. (With the capacity at its burst, a request that crosses
// loopback faster than the first one did is refused: see the upstream
// scenario in docs/benchmarks.md.)
func TestBucketsAtTheUpstreamsLimit(t *testing.T) {
	const rate, burst, total = 50, 3, 100
	srv := redistest.New(t)
	up := upstreamtest.New(upstreamtest.Config{Policies: []upstreamtest.Policy{{Rate: rate, Burst: burst}}, Remaining: true})
	defer up.Close()
	p := bucket.Rate(rate, time.Second, burst-1)
	cs := fleetOf(t, srv.Addr(), 2, bucket.Config{Name: t.Name(), Capacity: p.Capacity, RefillAmount: p.RefillAmount, RefillFrequency: p.RefillFrequency})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sendAll(ctx, t, cs, up.URL(), 3, func() bool { return up.Stats().Accepted >= total })
	st := up.Stats()
	if st.Accepted < total || st.Refused > 2 {
		t.Errorf("upstream accepted %d and refused %d; want %d accepted and at most 2 refused", st.Accepted, st.Refused, total)
	}
}

// The upstream announces an outage with Retry-After: once one process
// hears it, the hold in Redis stops both processes' callers, those
// queued too. Only requests granted before the bucket heard may reach the
// upstream during the hold: at 10 a second, one slot in the lookahead and
// one on the wire. Without the hold, each of the 6 callers sends one
// (local.Rate's test measures 14 without its Receiver). After the hold,
// no request is refused.
func TestBucketsHoldOnAnOutage(t *testing.T) {
	const rate = 10
	srv := redistest.New(t)
	up := upstreamtest.New(upstreamtest.Config{Policies: []upstreamtest.Policy{{Rate: rate, Burst: 3}}})
	defer up.Close()
	p := bucket.Rate(rate, time.Second, 1)
	cs := fleetOf(t, srv.Addr(), 2, bucket.Config{Name: t.Name(), Capacity: p.Capacity, RefillAmount: p.RefillAmount, RefillFrequency: p.RefillFrequency})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var once sync.Once
	sendAll(ctx, t, cs, up.URL(), 3, func() bool {
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
			t.Logf("during the hold, %v after it began: %d", a.At.Sub(arrivals[first].At), a.Status)
		case a.Status != http.StatusOK:
			t.Errorf("a %d after the hold, %v after it began", a.Status, a.At.Sub(arrivals[first].At))
		default:
			after++
		}
	}
	if during > 2 {
		t.Errorf("%d requests reached the upstream during the hold, want at most 2 (granted before the bucket heard of it)", during)
	}
	if after == 0 {
		t.Error("no request after the hold")
	}
}

var (
	exampleOnce sync.Once
	exampleAddr string
)

// exampleRedis is where the examples' Redis listens: a throwaway
// redis-server started on first use, so that the examples show only user
// code (use your own server's address). It is not waited for, so that no
// goroutine outlives the tests; the kernel kills it when this test binary
// exits (Pdeathsig). Without redis-server on PATH the example fails.
func exampleRedis() string {
	exampleOnce.Do(func() {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", os.TempDir(), "--loglevel", "warning")
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if cmd.Start() != nil {
			return
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		rdb := redis.NewClient(&redis.Options{Addr: addr})
		defer rdb.Close()
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if rdb.Ping(context.Background()).Err() == nil {
				exampleAddr = addr
				return
			}
		}
	})
	return exampleAddr
}
