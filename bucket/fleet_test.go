package bucket_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/hub"
	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/semaphore"
)

// clientConns counts the connections Redis has open for clients named name.
func clientConns(t *testing.T, admin *redis.Client, name string) int {
	t.Helper()
	list, err := admin.ClientList(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return strings.Count(list, " name="+name+" ")
}

// TestThousandsOfHandlesOneClient: 2,000 buckets and 200 semaphores on one
// client, a burst of callers to each. Every caller is granted, the
// process holds no more connections than its pool (plus the shared Pub/Sub
// connection) while they wait, and once they are done the idle handles
// cost no goroutine and no connection; Close of every handle ends the
// runtime. (Before the shared runtime, each bucket with a queued caller
// held a Pub/Sub connection and three goroutines until Close.)
func TestThousandsOfHandlesOneClient(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	const (
		buckets    = 2000
		semaphores = 200
		callers    = 3
		pool       = 20
	)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, PoolSize: pool, ClientName: "tenants"})
	defer rdb.Close()
	admin := srv.Client()
	defer admin.Close()
	base := runtime.NumGoroutine()

	bs := make([]*bucket.Bucket, buckets)
	for i := range bs {
		p := bucket.Rate(5, time.Second, 1)
		// MaxLateness 250 ms, as docs/guarantees.md advises for a host
		// whose wake-ups come that late: 6,600 callers in one process,
		// under -race beside a busy loop, returned from Enter up to ~240
		// ms after the bucket judged them on time, and the start times
		// are judged with MaxLateness as their slack.
		b, err := bucket.New(rdb, bucket.Config{Name: fmt.Sprintf("%s-%d", t.Name(), i), Capacity: p.Capacity, RefillAmount: p.RefillAmount, RefillFrequency: p.RefillFrequency, MaxLateness: 250 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		bs[i] = b
	}
	ss := make([]*semaphore.Semaphore, semaphores)
	for i := range ss {
		// Leases of 10 s rather than 2: a semaphore fails its waiters when
		// an exchange goes unanswered for two thirds of min(LeaseTTL,
		// QueueTTL), as their places could not be kept, and the burst of
		// 2,200 handles on one client beside a busy neighbour once held
		// one 1.3 s in a CI run. This test is about the handles' share of
		// one client, not that bound (TestAcquireRedisGoneWhileWaiting).
		s, err := semaphore.New(rdb, semaphore.Config{Name: fmt.Sprintf("%s-sem-%d", t.Name(), i), Capacity: 1, LeaseTTL: 10 * time.Second, QueueTTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		ss[i] = s
	}
	if n := runtime.NumGoroutine() - base; n > 5 {
		t.Errorf("%d handles started %d goroutines before any call, want none", buckets+semaphores, n)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, buckets*callers+semaphores*callers)
	var mu sync.Mutex
	grants := make([][]loadgen.Grant, buckets)
	maxConns := 0
	stopWatch := make(chan struct{})
	watched := make(chan struct{})
	go func() { // the connections while callers wait
		defer close(watched)
		for {
			n := clientConns(t, admin, "tenants")
			mu.Lock()
			maxConns = max(maxConns, n)
			mu.Unlock()
			select {
			case <-stopWatch:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	for i, b := range bs {
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rep, err := enterReport(ctx, b)
				end := time.Now() // before mu, which 6,600 callers share
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				grants[i] = append(grants[i], loadgen.Grant{Ticket: rep.Ticket, Slot: rep.Slot.UnixMicro(), End: end.UnixNano(), Late: int64(rep.Late)})
				mu.Unlock()
			}()
		}
	}
	for _, s := range ss {
		for range callers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if err := s.Do(ctx, func(context.Context) error { return nil }); err != nil {
					errs <- err
				}
			}()
		}
	}
	wg.Wait()
	close(stopWatch)
	<-watched
	close(errs)
	for err := range errs {
		t.Fatalf("a caller failed: %v", err)
	}
	for i, g := range grants {
		if len(g) != callers {
			t.Fatalf("bucket %d: %d grants, want %d", i, len(g), callers)
		}
	}
	// The guarantee on a sample of the buckets (every one would take long
	// under -race; each is judged the same way).
	for i := 0; i < buckets; i += 97 {
		checkGrants(t, grants[i], bs[i].Config())
	}
	// The bench's goal is pool + 2; go-redis dials beyond PoolSize when
	// the pool runs dry, so the test's bound is generous: before the
	// shared runtime it was over 2,000.
	if maxConns > pool+10 {
		t.Errorf("up to %d connections while callers waited, want ≤ pool %d + 10", maxConns, pool)
	}
	t.Logf("%d buckets × %d callers and %d semaphores × %d: at most %d connections while waiting", buckets, callers, semaphores, callers, maxConns)

	// Idle: the Pub/Sub connection closes after its linger, and nothing
	// runs for the idle handles.
	waitFor(t, 10*time.Second, "the idle handles to hold no goroutine", func() bool {
		return runtime.NumGoroutine()-base <= 10
	})
	h := hub.Acquire(rdb)
	waitFor(t, 10*time.Second, "the Pub/Sub connection to close", func() bool {
		return !h.PubSubStats().Open
	})
	h.Release()
	cmds := func() int64 {
		info, err := admin.Info(ctx, "stats").Result()
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, line := range strings.Split(info, "\r\n") {
			if v, ok := strings.CutPrefix(line, "total_commands_processed:"); ok {
				fmt.Sscan(v, &n)
			}
		}
		return n
	}
	before := cmds()
	time.Sleep(time.Second) // a span to count commands over, not a wait for a condition
	// The probe's own INFO is one command.
	if n := cmds() - before - 1; n > 5 {
		t.Errorf("%d Redis commands in a second from %d idle handles, want ≤ 5", n, buckets+semaphores)
	}

	start := time.Now()
	for _, b := range bs {
		b.Close()
	}
	for _, s := range ss {
		s.Close()
	}
	t.Logf("Close of %d handles took %v", buckets+semaphores, time.Since(start))
	if n := hub.Live(); n != 0 {
		t.Errorf("%d hubs live after every handle closed", n)
	}
}

// TestCloseOneHandleOthersQueued: two buckets on one client, each with
// callers queued. Closing one ends its callers with sluice.ErrClosed and leaves
// the other's untouched: every one of them is granted.
func TestCloseOneHandleOthersQueued(t *testing.T) {
	srv := redistest.New(t)
	rdb := srv.Client()
	defer rdb.Close()
	cfg := bucket.Config{Capacity: 1, RefillAmount: 1, RefillFrequency: 20 * time.Millisecond}
	cfg.Name = t.Name() + "-a"
	a := newBucket(t, rdb, cfg)
	cfg.Name = t.Name() + "-b"
	b := newBucket(t, rdb, cfg)
	ctx := withTimeout(t, 20*time.Second)

	const n = 20
	aErrs, bErrs := make(chan error, n), make(chan error, n)
	for range n {
		go func() { aErrs <- a.Enter(ctx) }()
		go func() { bErrs <- b.Enter(ctx) }()
	}
	waitFor(t, 5*time.Second, "callers of both buckets to queue", func() bool {
		la, _ := rdb.LLen(ctx, bucket.Keys(a).Queue).Result()
		lb, _ := rdb.LLen(ctx, bucket.Keys(b).Queue).Result()
		return la >= 5 && lb >= 5
	})
	a.Close()
	closed := 0
	for range n {
		if err := <-aErrs; errors.Is(err, sluice.ErrClosed) {
			closed++
		} else if err != nil {
			t.Errorf("a caller of the closed bucket: %v", err)
		}
	}
	if closed == 0 {
		t.Error("no caller of the closed bucket got sluice.ErrClosed")
	}
	for range n {
		if err := <-bErrs; err != nil {
			t.Errorf("a caller of the other bucket: %v", err)
		}
	}
}

// TestCloseHandsOver: two processes (two clients) share a bucket whose
// lock lives 10 s. The one scheduling closes while the other's callers
// wait: they are all granted at the bucket's pace, without waiting out the
// lock, because Close hands the lock over.
func TestCloseHandsOver(t *testing.T) {
	srv := redistest.New(t)
	rdbA, rdbB := srv.Client(), srv.Client()
	defer rdbA.Close()
	defer rdbB.Close()
	cfg := bucket.Config{Name: t.Name(), Capacity: 1, RefillAmount: 1, RefillFrequency: 50 * time.Millisecond, LockTTL: 10 * time.Second}
	a := newBucket(t, rdbA, cfg)
	b := newBucket(t, rdbB, cfg)
	ctx := withTimeout(t, 30*time.Second)
	keys := bucket.Keys(a)

	// A queues first, so A's process takes the lock.
	aErrs := make(chan error, 10)
	for range 10 {
		go func() { aErrs <- a.Enter(ctx) }()
	}
	waitFor(t, 5*time.Second, "A to hold the lock", func() bool {
		n, _ := rdbA.Exists(ctx, keys.Lock).Result()
		return n == 1
	})
	const n = 10
	bDone := make(chan time.Time, n)
	for range n {
		go func() {
			if err := b.Enter(ctx); err != nil {
				t.Error(err)
			}
			bDone <- time.Now()
		}()
	}
	waitFor(t, 5*time.Second, "B's callers to queue", func() bool {
		l, _ := rdbA.LLen(ctx, keys.Queue).Result()
		return l >= 12
	})
	closedAt := time.Now()
	a.Close()
	for range 10 {
		<-aErrs
	}
	var last time.Time
	for range n {
		last = <-bDone
	}
	// At most 20 queued (A's cancelled and B's 10) at 50 ms: about 1 s.
	if d := last.Sub(closedAt); d > 4*time.Second {
		t.Errorf("B's callers took %v after A closed: the lock (TTL 10 s) was not handed over", d)
	}
}

// The fleet worker: a process that schedules many buckets (run by
// TestSchedulerDiesWithManyBuckets; this test binary re-executed).
const envFleet = "SLUICE_FLEET_WORKER"

func init() {
	spec := os.Getenv(envFleet)
	if spec == "" {
		return
	}
	var addr, prefix string
	var n int
	fmt.Sscan(spec, &addr, &prefix, &n)
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	ctx := context.Background()
	for i := range n {
		b, err := bucket.New(rdb, fleetConfig(prefix, i))
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		for range 20 { // queued callers keep this process scheduling
			go func() {
				for b.Enter(ctx) == nil {
				}
			}()
		}
	}
	fmt.Println("ready")
	select {} // until killed
}

func fleetConfig(prefix string, i int) bucket.Config {
	return bucket.Config{Name: fmt.Sprintf("%s-%d", prefix, i), Capacity: 1, RefillAmount: 1, RefillFrequency: 20 * time.Millisecond, LockTTL: time.Second}
}

// TestSchedulerDiesWithManyBuckets: a process schedules 100 buckets (it
// holds their locks) while this one has callers queued on each; it is
// SIGKILLed. Every bucket's callers here go on: each bucket stalls at
// most about one LockTTL (all at once, not one after another), and the
// guarantee holds over every grant here.
func TestSchedulerDiesWithManyBuckets(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	const n = 100
	prefix := t.Name()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %d", envFleet, srv.Addr(), prefix, n))
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	t.Cleanup(func() {
		if !killed {
			_ = cmd.Process.Kill()
		}
		_ = cmd.Wait()
	})
	line, _ := bufio.NewReader(out).ReadString('\n')
	if strings.TrimSpace(line) != "ready" {
		t.Fatalf("worker: %q", line)
	}
	rdb := srv.Client()
	defer rdb.Close()
	ctx := withTimeout(t, 60*time.Second)
	pid := fmt.Sprint(cmd.Process.Pid)
	holders := func() (worker int) {
		for i := range n {
			v, _ := rdb.Get(ctx, keysFor(fleetConfig(prefix, i)).Lock).Result()
			if strings.HasSuffix(protocol.LockHolder(v), ":"+pid) {
				worker++
			}
		}
		return worker
	}
	waitFor(t, 20*time.Second, "the worker to schedule most buckets", func() bool { return holders() >= n*9/10 })

	// Callers here on every bucket, queued behind the worker's.
	var mu sync.Mutex
	grants := make([][]loadgen.Grant, n)
	var wg sync.WaitGroup
	until := time.Now().Add(5 * time.Second)
	for i := range n {
		b := newBucket(t, rdb, fleetConfig(prefix, i))
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(until) {
					rep, err := enterReport(ctx, b)
					end := time.Now() // before mu, which every caller shares
					if err != nil {
						t.Errorf("bucket %d: %v", i, err)
						return
					}
					mu.Lock()
					grants[i] = append(grants[i], loadgen.Grant{Ticket: rep.Ticket, Slot: rep.Slot.UnixMicro(), End: end.UnixNano(), Late: int64(rep.Late)})
					mu.Unlock()
				}
			}()
		}
	}
	time.Sleep(time.Second) // let both processes' callers queue and be served: a span, not a condition
	killedAt := time.Now()
	if err := syscall.Kill(cmd.Process.Pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed = true
	wg.Wait()
	worst := time.Duration(0)
	for i := range n {
		checkGrants(t, grants[i], fleetConfig(prefix, i))
		// The first grant here after the kill, per bucket.
		first := time.Duration(-1)
		for _, g := range grants[i] {
			if d := time.Unix(0, g.End).Sub(killedAt); d >= 0 && (first < 0 || d < first) {
				first = d
			}
		}
		if first < 0 {
			t.Fatalf("bucket %d: no grant here after the kill", i)
		}
		worst = max(worst, first)
	}
	// LockTTL 1 s, plus the callers' back-off and a loaded machine.
	if worst > 3*time.Second {
		t.Errorf("a bucket's first grant after the kill came %v later, want about one LockTTL (1 s)", worst)
	}
	t.Logf("worst first grant after the kill: %v", worst)
}

// TestOverloadStarvedProcesses: three worker processes saturate a bucket
// while each also runs busy goroutines (2 a CPU), so their callers often
// wake past MaxLateness. The guarantee holds over every grant (slots and
// starts), and the grants do not collapse: a late caller keeps its place
// and gives its token back when that is exact, rather than queueing again
// at the back and throwing the token away (before, such a run granted a
// tenth of the limit).
func TestOverloadStarvedProcesses(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	cfg := bucket.Config{Name: t.Name(), Capacity: 20, RefillAmount: 1, RefillFrequency: 5 * time.Millisecond}
	const run = 3 * time.Second
	start := time.Now().Add(500 * time.Millisecond)
	var procs []*loadgen.Proc
	for i := range 3 {
		procs = append(procs, startWorker(t, loadgen.Spec{Proc: i, Addr: srv.Addr(), Bucket: cfg, Callers: 30, Until: run,
			StartAt: start.UnixNano(), Hog: 2 * runtime.NumCPU(), QuietRedis: true}))
	}
	var all []loadgen.Grant
	retimes, refunds, reentries := 0, 0, 0
	for _, p := range procs {
		g := wait(t, p)
		all = append(all, g...)
		for _, x := range g {
			retimes += x.Retimes
			refunds += x.Refunds
			reentries += x.Reentries
		}
	}
	checkGrants(t, all, cfg)
	allowed := float64(cfg.Capacity) + run.Seconds()*float64(time.Second/cfg.RefillFrequency)
	util := float64(len(all)) / allowed
	t.Logf("%d grants of %.0f the limit allows over %v (%.2f), %d retimes (%d tokens given back), %d re-entries",
		len(all), allowed, run, util, retimes, refunds, reentries)
	// A late caller keeps its place: it never queues again at the back
	// (797 re-entries in this run when it did). Utilization is the bench's
	// goal (≥ 0.9); here only a collapse fails: 0.48–0.78 under -race,
	// with the machine idle or loaded, against about 0.1 without -race
	// when late callers queued again.
	if reentries != 0 {
		t.Errorf("%d re-entries: late callers queued again at the back", reentries)
	}
	if util < 0.3 {
		t.Errorf("utilization %.2f: overload collapsed", util)
	}
}
