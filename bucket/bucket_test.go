package bucket_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

func valid() bucket.Config {
	return bucket.Config{Name: "n", Capacity: 10, RefillAmount: 1, RefillFrequency: time.Second}
}

func TestNewRejectsBadInput(t *testing.T) {
	srv := redistest.New(t)
	rdb := srv.Client()
	defer rdb.Close()
	with := func(f func(*bucket.Config)) bucket.Config { c := valid(); f(&c); return c }
	for _, tc := range []struct {
		name string
		rdb  redis.UniversalClient
		cfg  bucket.Config
		want string
	}{
		{"nil client", nil, valid(), "nil redis client"},
		{"typed nil client", (*redis.Client)(nil), valid(), "nil redis client"},
		{"empty name", rdb, with(func(c *bucket.Config) { c.Name = "" }), "empty Name"},
		{"zero capacity", rdb, with(func(c *bucket.Config) { c.Capacity = 0 }), "Capacity 0"},
		{"negative capacity", rdb, with(func(c *bucket.Config) { c.Capacity = -3 }), "Capacity -3"},
		{"zero refill", rdb, with(func(c *bucket.Config) { c.RefillAmount = 0 }), "RefillAmount 0"},
		{"refill above capacity", rdb, with(func(c *bucket.Config) { c.RefillAmount = 11 }), "above Capacity 10: tokens beyond Capacity are never usable; for 11 per"},
		{"zero frequency", rdb, with(func(c *bucket.Config) { c.RefillFrequency = 0 }), "RefillFrequency 0s"},
		{"negative frequency", rdb, with(func(c *bucket.Config) { c.RefillFrequency = -time.Second }), "RefillFrequency -1s"},
		{"sub-µs frequency", rdb, with(func(c *bucket.Config) { c.RefillFrequency = 1500 * time.Nanosecond }), "whole number of microseconds"},
		{"brace in prefix", rdb, with(func(c *bucket.Config) { c.KeyPrefix = "a{b" }), "brace"},
		{"short lock TTL", rdb, with(func(c *bucket.Config) { c.LockTTL = time.Millisecond }), "LockTTL"},
		{"lookahead past TTL/2", rdb, with(func(c *bucket.Config) { c.Lookahead = time.Second }), "Lookahead"},
		{"negative MaxQueue", rdb, with(func(c *bucket.Config) { c.MaxQueue = -1 }), "MaxQueue"},
		{"negative MaxWait", rdb, with(func(c *bucket.Config) { c.MaxWait = -1 }), "MaxWait"},
		{"MaxWait 1ns", rdb, with(func(c *bucket.Config) { c.MaxWait = time.Nanosecond }), "MaxWait 1ns, want 0 (unbounded) or ≥ 1µs"},
		{"MaxWait 999ns", rdb, with(func(c *bucket.Config) { c.MaxWait = 999 * time.Nanosecond }), "MaxWait 999ns"},
		{"MaxLateness no caller keeps", rdb, with(func(c *bucket.Config) { c.MaxLateness = time.Microsecond }), "MaxLateness 1µs, want 0 (default 25ms), negative (start however late) or ≥ 1ms"},
		{"MaxLateness just under 1 ms", rdb, with(func(c *bucket.Config) { c.MaxLateness = 999 * time.Microsecond }), "MaxLateness 999µs"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := bucket.New(tc.rdb, tc.cfg)
			if err == nil {
				b.Close()
				t.Fatal("New accepted it")
			}
			if !errors.Is(err, sluice.ErrConfig) || !contains(err.Error(), tc.want) {
				t.Fatalf("error %q, want ErrConfig mentioning %q", err, tc.want)
			}
		})
	}
}

func contains(s, sub string) bool {
	return len(sub) == 0 || (len(s) >= len(sub) && (s == sub || indexOf(s, sub) >= 0))
}

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

// TestUnreachableRedisNamed: New does no I/O (the convention of every
// constructor here), so a Redis that is down shows at the first Enter: at
// once, naming the refused connection, and not as the caller's deadline;
// with a deadline that ends first, the error matches it and still names
// the cause.
func TestUnreachableRedisNamed(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond, ContextTimeoutEnabled: true})
	defer rdb.Close()
	b, err := bucket.New(rdb, valid())
	if err != nil {
		t.Fatalf("New did I/O: %v", err)
	}
	defer b.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = b.Enter(ctx)
	if !errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, context.DeadlineExceeded) || !contains(err.Error(), "connection refused") {
		t.Fatalf("Enter with Redis down: %v, want connection refused, not a deadline", err)
	}

	// A client with go-redis's default retries, as users write it: its
	// dial retries and backoffs outlast a 200 ms deadline, and go-redis
	// then returns only the deadline. The error still names the cause.
	plain := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer plain.Close()
	b2, err := bucket.New(plain, valid())
	if err != nil {
		t.Fatal(err)
	}
	defer b2.Close()
	ctx, cancel = context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	err = b2.Enter(ctx)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, syscall.ECONNREFUSED) || !contains(err.Error(), "connection refused") {
		t.Fatalf("Enter with Redis down and a 200ms deadline: %v, want the deadline and connection refused", err)
	}
	t.Logf("200ms deadline, default retries: %v", err)
}

// TestNewRejectsClientIgnoringDeadlines: a client without
// ContextTimeoutEnabled would let a frozen Redis hold an Enter past its
// deadline (5 s against 200 ms, measured): New refuses it, naming the option.
func TestNewRejectsClientIgnoringDeadlines(t *testing.T) {
	for name, rdb := range map[string]redis.UniversalClient{
		"client":  redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}),
		"cluster": redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}}),
		"ring":    redis.NewRing(&redis.RingOptions{Addrs: map[string]string{"a": "127.0.0.1:1"}}),
	} {
		_, err := bucket.New(rdb, valid())
		rdb.Close()
		if !errors.Is(err, sluice.ErrConfig) || !contains(err.Error(), "ContextTimeoutEnabled") {
			t.Errorf("%s: New = %v, want ErrConfig naming ContextTimeoutEnabled", name, err)
		}
	}
}

// TestFastPathOneRoundTrip: with tokens free and nobody queued, Enter
// returns after exactly one round trip and no poll.
func TestFastPathOneRoundTrip(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	b := newBucket(t, rdb, bucket.Config{Capacity: 5, RefillAmount: 1, RefillFrequency: time.Hour})
	for i := 0; i < 5; i++ {
		rep, err := enterReport(context.Background(), b)
		if err != nil {
			t.Fatal(err)
		}
		if rep.RoundTrips != 1 || rep.Polls != 0 || rep.Position != 0 {
			t.Fatalf("Enter %d: %+v, want 1 round trip, no poll, not queued", i, rep)
		}
	}
	if b.Stats().Steps != 0 {
		t.Fatal("the fast path started a scheduler")
	}
}

// onTimePolls judges polling (defect 8: busy polling) among the queued
// callers that came on time for their slots (neither retimed nor
// claiming: a caller that woke too late polls once more for the next
// slot written for it, by design, design.md "A late caller is not told a
// slot it may miss"). A caller polls once, a lead before its slot, and
// again when its slot is not written yet: the scheduler stepped late (a
// busy host starves its goroutine; beside a busy loop TestSaturation saw
// 1.21 polls a caller). Busy polling is a poll every few milliseconds:
// tens a caller. So: at most 1.5 polls a caller on average, and none
// more than 5 (the rate itself is the bench's: Redis calls per grant).
func onTimePolls(t *testing.T, grants []loadgen.Grant) {
	t.Helper()
	polls, queued, most := 0, 0, 0
	for _, g := range grants {
		if g.Position > 0 && g.Retimes == 0 && g.Claims == 0 {
			queued++
			polls += g.Polls
			most = max(most, g.Polls)
		}
	}
	if r := float64(polls) / float64(max(queued, 1)); r > 1.5 || most > 5 {
		t.Errorf("%.2f polls per queued caller on time for its slot (%d), at most %d: want ≤ 1.5, and ≤ 5 each", r, queued, most)
	}
}

// TestSaturation: many goroutines sharing one Bucket object at the limit.
// Covers defect 6 (one object reused for every Enter: each gets a fresh
// ID) and defect 8 (busy polling: ≤ 1.2 polls per queued waiter).
func TestSaturation(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	b := newBucket(t, rdb, bucket.Config{Capacity: 5, RefillAmount: 2, RefillFrequency: 8 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	grants := enterAll(ctx, b, 100, 4)
	checkGrants(t, grants, b.Config())
	polls, queued := 0, 0
	for _, g := range grants {
		if g.Position > 0 {
			queued++
			polls += g.Polls
		}
	}
	if queued < len(grants)/2 {
		t.Fatalf("only %d of %d callers queued: not saturated", queued, len(grants))
	}
	onTimePolls(t, grants)
	// The bucket was busy the whole time, so the grants took about
	// (n − Capacity) / rate; seconds-for-milliseconds (defect 5) would take
	// a thousand times longer and trip the 1-minute ctx above.
	first, last := grants[0].Time(), grants[0].Time()
	for _, g := range grants {
		if g.Time().Before(first) {
			first = g.Time()
		}
		if g.Time().After(last) {
			last = g.Time()
		}
	}
	ideal := time.Duration(len(grants)-5) * 8 * time.Millisecond / 2
	t.Logf("%d grants in %v (ideal %v), %d queued, %.2f polls each", len(grants), last.Sub(first), ideal, queued, float64(polls)/float64(queued))
}

// TestCapacityOneFastRefill is defect 5 (unsigned underflow: the whole
// queue got one slot at refill periods ≤ 20 ms) with capacity 1.
func TestCapacityOneFastRefill(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	for _, every := range []time.Duration{time.Millisecond, 5 * time.Millisecond, 20 * time.Millisecond} {
		t.Run(every.String(), func(t *testing.T) {
			b := newBucket(t, rdb, bucket.Config{Name: t.Name(), Capacity: 1, RefillAmount: 1, RefillFrequency: every})
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			grants := enterAll(ctx, b, 20, 3)
			checkGrants(t, grants, b.Config())
		})
	}
}

// TestIdleThenBurst: a bucket that sat idle serves Capacity at once and
// then the refill rate, never more (the old single-script design handed
// out past slots after idling).
func TestIdleThenBurst(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	cfg := bucket.Config{Capacity: 10, RefillAmount: 1, RefillFrequency: 5 * time.Millisecond}
	b := newBucket(t, rdb, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var all []loadgen.Grant
	for round := 0; round < 3; round++ {
		all = append(all, enterAll(ctx, b, 30, 1)...)
		// Idle long enough to refill completely.
		time.Sleep(time.Duration(cfg.Capacity) * cfg.RefillFrequency * 2)
	}
	checkGrants(t, all, b.Config())
	fast := 0
	for _, g := range all {
		if g.Position == 0 && g.Polls == 0 {
			fast++
		}
	}
	if fast < 3*cfg.Capacity {
		t.Errorf("%d grants without queueing over 3 bursts, want ≥ %d (the refilled bucket)", fast, 3*cfg.Capacity)
	}
}

// TestCancelQueuedCallers: callers cancelled while queued return promptly
// with their ctx error and spend no token: the next caller's wait is what
// an empty queue gives.
func TestCancelQueuedCallers(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	cfg := bucket.Config{Capacity: 1, RefillAmount: 1, RefillFrequency: 100 * time.Millisecond}
	b := newBucket(t, rdb, cfg)
	if err := b.Enter(context.Background()); err != nil { // spend the one token
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	const n = 200
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() { errs <- b.Enter(ctx) }()
	}
	waitFor(t, 10*time.Second, "callers to queue", func() bool {
		l, _ := rdb.LLen(context.Background(), bucket.Keys(b).Queue).Result()
		return l >= n-2 // the first one or two may hold assigned slots
	})
	cancel()
	deadline := time.After(10 * time.Second)
	cancelled := 0
	for i := 0; i < n; i++ {
		select {
		case err := <-errs:
			if errors.Is(err, context.Canceled) {
				cancelled++
			} else if err != nil {
				t.Errorf("Enter: %v, want nil or context.Canceled", err)
			}
		case <-deadline:
			t.Fatalf("only %d of %d callers returned after cancel", i, n)
		}
	}
	if cancelled < n-3 {
		t.Fatalf("%d cancelled, want ≥ %d", cancelled, n-3)
	}
	// Cancels land in the background, batched: the queue empties soon.
	waitFor(t, 5*time.Second, "the cancelled callers to leave the queue", func() bool {
		l, _ := rdb.LLen(context.Background(), bucket.Keys(b).Queue).Result()
		return l == 0
	})
	// Had the cancelled callers spent tokens, this one would wait ~20 s.
	rep, err := b.EnterReport(withTimeout(t, 2*time.Second))
	if err != nil {
		t.Fatalf("Enter after the cancellation storm: %v (%+v)", err, rep)
	}
	if rep.Position > 1 {
		t.Fatalf("next caller queued at %d, want the head", rep.Position)
	}
}

func withTimeout(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// TestDeadlineWhileQueued: a caller whose deadline passes while queued
// returns an error matching context.DeadlineExceeded.
func TestDeadlineWhileQueued(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	b := newBucket(t, rdb, bucket.Config{Capacity: 1, RefillAmount: 1, RefillFrequency: time.Hour})
	if err := b.Enter(context.Background()); err != nil {
		t.Fatal(err)
	}
	err := b.Enter(withTimeout(t, 30*time.Millisecond))
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Enter: %v, want DeadlineExceeded", err)
	}
	waitFor(t, 5*time.Second, "the expired caller to leave the queue", func() bool {
		l, _ := rdb.LLen(context.Background(), bucket.Keys(b).Queue).Result()
		return l == 0
	})
}

func TestMaxQueueAndMaxWait(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	b := newBucket(t, rdb, bucket.Config{Capacity: 1, RefillAmount: 1, RefillFrequency: time.Hour, MaxQueue: 2})
	if err := b.Enter(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := 0; i < 2; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); _ = b.Enter(ctx) }()
	}
	waitFor(t, 5*time.Second, "two queued callers", func() bool {
		l, _ := rdb.LLen(context.Background(), bucket.Keys(b).Queue).Result()
		return l == 2
	})
	err := b.Enter(context.Background())
	if !errors.Is(err, sluice.ErrQueueFull) || !errors.Is(err, sluice.ErrLimited) {
		t.Fatalf("third waiter: %v, want sluice.ErrQueueFull (an ErrLimited)", err)
	}
	cancel()
	wg.Wait()

	b2 := newBucket(t, rdb, bucket.Config{Name: t.Name() + "-wait", Capacity: 1, RefillAmount: 1, RefillFrequency: time.Hour, MaxWait: time.Minute})
	if err := b2.Enter(context.Background()); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = b2.Enter(context.Background())
	if !errors.Is(err, sluice.ErrWaitTooLong) || !errors.Is(err, sluice.ErrLimited) {
		t.Fatalf("wait of an hour with MaxWait 1m: %v, want sluice.ErrWaitTooLong", err)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatal("the refusal waited instead of refusing at once")
	}
}

func TestEnterAfterClose(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	b := newBucket(t, rdb, valid())
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Enter(context.Background()); !errors.Is(err, sluice.ErrClosed) {
		t.Fatalf("Enter after Close: %v, want sluice.ErrClosed", err)
	}
	if err := b.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestCloseWakesWaiters: callers waiting when their Bucket closes return
// sluice.ErrClosed, and Close releases the scheduler lock at once.
func TestCloseWakesWaiters(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	b, err := bucket.New(rdb, bucket.Config{Name: t.Name(), Capacity: 1, RefillAmount: 1, RefillFrequency: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if err := b.Enter(context.Background()); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- b.Enter(context.Background()) }()
	waitFor(t, 5*time.Second, "the scheduler lock", func() bool {
		n, _ := rdb.Exists(context.Background(), bucket.Keys(b).Lock).Result()
		return n == 1
	})
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, sluice.ErrClosed) {
			t.Fatalf("waiter: %v, want sluice.ErrClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("waiter did not return after Close")
	}
	if n, _ := rdb.Exists(context.Background(), bucket.Keys(b).Lock).Result(); n != 0 {
		t.Fatal("Close left the scheduler lock held")
	}
}

// TestNoLostWakeUp: callers that arrive just as the scheduler finds the
// queue empty and stops must not wait for the lock's TTL. With a one-minute
// TTL and a short deadline, a lost wake-up fails the Enter.
func TestNoLostWakeUp(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	cfg := bucket.Config{Capacity: 1, RefillAmount: 1, RefillFrequency: 2 * time.Millisecond, LockTTL: time.Minute, Lookahead: time.Millisecond}
	// Several handles = several would-be schedulers, as in several processes.
	var bs []*bucket.Bucket
	for i := 0; i < 3; i++ {
		bs = append(bs, newBucket(t, rdb, cfg))
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	errs := make(chan error, 1000)
	for g := 0; g < 6; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; i < 60; i++ {
				ectx, cancel := context.WithTimeout(ctx, 3*time.Second)
				err := bs[(g+i)%len(bs)].Enter(ectx)
				cancel()
				if err != nil {
					errs <- fmt.Errorf("caller %d, Enter %d: %w", g, i, err)
					return
				}
				// Pause so that the queue often empties and the
				// scheduler stops between arrivals.
				time.Sleep(time.Duration(i%4) * time.Millisecond)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	var steps int64
	for _, b := range bs {
		steps += b.Stats().Steps
	}
	if steps == 0 {
		t.Fatal("no scheduler ever ran: the test did not exercise stop-and-restart")
	}
}

// TestKeysHaveTTL: after use, every key of the bucket expires.
func TestKeysHaveTTL(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	b := newBucket(t, rdb, bucket.Config{Capacity: 2, RefillAmount: 1, RefillFrequency: 2 * time.Millisecond})
	enterAll(withTimeout(t, 30*time.Second), b, 10, 3)
	keys := keysOf(t, rdb, b)
	if len(keys) == 0 {
		t.Fatal("no keys found: the pattern is wrong")
	}
	for _, k := range keys {
		ttl, err := rdb.PTTL(context.Background(), k).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ttl < 0 {
			t.Errorf("key %q has no TTL (%v)", k, ttl)
		}
		if k == bucket.Keys(b).Config {
			// The limit outlives idle spells (the config key).
			if ttl < 29*24*time.Hour || ttl > 30*24*time.Hour {
				t.Errorf("config key %q lives %v, want 30 days", k, ttl)
			}
			continue
		}
		if ttl > time.Minute {
			t.Errorf("key %q lives %v after the bucket went idle", k, ttl)
		}
	}
}

// TestAnyName: names with braces, spaces, newlines and bytes work and do
// not share state.
func TestAnyName(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	names := []string{"{x}", "x", "a b\nc", "}{", "%7Bx%7D", "\x00\xff"}
	for _, n := range names {
		b := newBucket(t, rdb, bucket.Config{Name: n, Capacity: 1, RefillAmount: 1, RefillFrequency: time.Hour})
		rep, err := b.EnterReport(context.Background())
		if err != nil {
			t.Fatalf("name %q: %v", n, err)
		}
		if rep.Position != 0 {
			t.Fatalf("name %q queued: it shares a bucket with another name", n)
		}
	}
}

// TestClockSkew is defect 4: slots were one host's wall-clock times
// compared on another. Here two handles whose local clocks are 5 s fast and
// 5 s slow share a saturated bucket: Redis TIME is the only clock, replies
// carry durations, so grants are exactly as without skew.
func TestClockSkew(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	cfg := bucket.Config{Name: t.Name(), Capacity: 3, RefillAmount: 1, RefillFrequency: 4 * time.Millisecond}
	fast, slow := newBucket(t, rdb, cfg), newBucket(t, rdb, cfg)
	bucket.SkewClock(fast, 5*time.Second)
	bucket.SkewClock(slow, -5*time.Second)
	ctx := withTimeout(t, 30*time.Second)
	var mu sync.Mutex
	var all []loadgen.Grant
	var wg sync.WaitGroup
	for _, b := range []*bucket.Bucket{fast, slow} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := enterAll(ctx, b, 20, 5)
			mu.Lock()
			all = append(all, g...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	checkGrants(t, all, fast.Config())
	for _, g := range all {
		if g.Wait() > 2*time.Second {
			t.Fatalf("a skewed caller waited %v: the skew leaked into a sleep", g.Wait())
		}
	}
}

// TestLongWaitPollsOnce: a caller whose slot is far off sleeps until it,
// however short the scheduler's lock TTL: one poll, not one per TTL.
func TestLongWaitPollsOnce(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	b := newBucket(t, rdb, bucket.Config{Capacity: 1, RefillAmount: 1, RefillFrequency: 1500 * time.Millisecond, LockTTL: 100 * time.Millisecond})
	if err := b.Enter(context.Background()); err != nil {
		t.Fatal(err)
	}
	rep, err := enterReport(withTimeout(t, 10*time.Second), b)
	if err != nil {
		t.Fatal(err)
	}
	// One poll; a second if a busy machine delays the scheduler past the
	// caller's lead. Polling every lock TTL would be about 15.
	if rep.Polls > 2 {
		t.Fatalf("%d polls over a %v wait with a %v lock TTL, want 1 (2 on a busy machine)", rep.Polls, rep.Wait, 100*time.Millisecond)
	}
}

// TestFreshIDs: every arrival has its own ID, also across Buckets of one
// name in one process (defect 6).
func TestFreshIDs(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	cfg := bucket.Config{Name: t.Name(), Capacity: 1, RefillAmount: 1, RefillFrequency: time.Hour}
	a, b := newBucket(t, rdb, cfg), newBucket(t, rdb, cfg)
	seen := map[string]bool{}
	for i := 0; i < 1000; i++ {
		for _, id := range []string{bucket.NewID(a), bucket.NewID(b)} {
			if seen[id] {
				t.Fatalf("ID %q used twice", id)
			}
			if strings.ContainsAny(id, "| \n") {
				t.Fatalf("ID %q holds a separator of entries or wake messages", id)
			}
			seen[id] = true
		}
	}
}

// TestFailedCallsLeaveLatenessAlone: Enters cut short by their deadline
// (no reply, so no round trip measured) must not blunt the lateness check
// of later ones: the shortest round trip seen stays a round trip.
func TestFailedCallsLeaveLatenessAlone(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	rdb := srv.Client()
	defer rdb.Close()
	b := newBucket(t, rdb, bucket.Config{Capacity: 1, RefillAmount: 1, RefillFrequency: time.Hour, MaxLateness: 5 * time.Millisecond})
	if err := b.Enter(context.Background()); err != nil {
		t.Fatal(err)
	}
	// Redis frozen: the first caller's enqueue hangs in flight, the others
	// gather behind it and give up before any reply.
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); _ = b.Enter(ctx) }()
	}
	wg.Wait()
	cancel()
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	if rtt := bucket.MinRoundTrip(b); rtt > time.Second {
		t.Fatalf("shortest round trip seen is %v after failed calls: no lateness would ever count", rtt)
	}
}

// TestCloseDuringBurst: Close while hundreds of callers are arriving (some
// inline, some gathered for a batch, some queued): every one returns, those
// cut short with sluice.ErrClosed, and no goroutine outlives the Bucket (goleak in
// TestMain).
func TestCloseDuringBurst(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	b, err := bucket.New(rdb, bucket.Config{Name: t.Name(), Capacity: 5, RefillAmount: 1, RefillFrequency: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	errs := make(chan error, 300)
	for i := 0; i < 300; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); errs <- b.Enter(context.Background()) }()
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("callers still blocked 10 s after Close")
	}
	close(errs)
	granted, closed := 0, 0
	for err := range errs {
		switch {
		case err == nil:
			granted++
		case errors.Is(err, sluice.ErrClosed):
			closed++
		default:
			t.Errorf("Enter: %v, want nil or sluice.ErrClosed", err)
		}
	}
	if granted > 5 {
		t.Errorf("%d granted by a bucket of 5 tokens an hour", granted)
	}
	t.Logf("%d granted, %d closed", granted, closed)
}
