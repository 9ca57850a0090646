package hub

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/internal/testing/testkit"
)

// TestReach: while a handle watches, a killed Redis is marked away, and
// back once restarted; a frozen one away, and back once thawed; the probe
// stops once no handle watches.
func TestReach(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	rdb := srv.Client()
	defer rdb.Close()
	h := Acquire(rdb)
	defer h.Release()
	unwatch := h.Watch()
	awayIs := func(want bool, what string) {
		t.Helper()
		start := time.Now()
		testkit.WaitFor(t, 5*time.Second, what, func() bool { a, _ := h.Away(); return a == want })
		t.Logf("%s after %v", what, time.Since(start).Round(time.Millisecond))
	}
	awayIs(false, "reachable at first")
	if err := srv.Kill(); err != nil {
		t.Fatal(err)
	}
	awayIs(true, "away once killed")
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	awayIs(false, "back once restarted")

	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	resumed := false
	defer func() {
		if !resumed {
			srv.Resume()
		}
	}()
	awayIs(true, "away once frozen")
	if err := srv.Resume(); err != nil {
		t.Fatal(err)
	}
	resumed = true
	awayIs(false, "back once thawed")

	unwatch()
	testkit.WaitFor(t, 5*time.Second, "the probe to stop", func() bool {
		h.reach.mu.Lock()
		defer h.reach.mu.Unlock()
		return !h.reach.running
	})
}

// TestUnreachable: network failures and LOADING are unreachable; an
// answer, even an error reply, is not.
func TestUnreachable(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{nil, false},
		{redis.Nil, false},
		{context.DeadlineExceeded, true},
		{errors.New("dial tcp: connection refused"), true},
		{redisError("READONLY You can't write against a read only replica."), false},
		{redisError("OOM command not allowed"), false},
		{redisError("LOADING Redis is loading the dataset in memory"), true},
	} {
		if got := Unreachable(c.err); got != c.want {
			t.Errorf("Unreachable(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

type redisError string

func (e redisError) Error() string { return string(e) }
func (redisError) RedisError()     {}

// TestAnswers: a healthy Redis answers, also while this process's pool
// is taken by calls that hang (the PING has a connection of its own); a
// frozen one does not, within the bound; many askers share one PING.
func TestAnswers(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true, PoolSize: 2, PoolTimeout: 5 * time.Second})
	defer rdb.Close()
	h := Acquire(rdb)
	defer h.Release()
	ctx := context.Background()
	if !h.Answers(ctx, time.Second) {
		t.Fatal("a healthy Redis: no answer")
	}
	// Take the whole pool with two BLPOPs that wait 3 s.
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() { rdb.BLPop(ctx, 3*time.Second, "nothing") })
	}
	testkit.WaitFor(t, 5*time.Second, "the pool taken", func() bool { return rdb.PoolStats().TotalConns == 2 && rdb.PoolStats().IdleConns == 0 })
	time.Sleep(2 * answerFresh) // the last answer no longer serves
	start := time.Now()
	if !h.Answers(ctx, time.Second) {
		t.Error("a healthy Redis, the pool taken: no answer")
	}
	t.Logf("answered in %v with the pool taken", time.Since(start).Round(time.Millisecond))
	wg.Wait()

	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	defer srv.Resume()
	time.Sleep(2 * answerFresh)
	var yes atomic.Int32
	start = time.Now()
	for range 100 {
		wg.Go(func() {
			if h.Answers(ctx, 300*time.Millisecond) {
				yes.Add(1)
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	t.Logf("100 askers of a frozen Redis: %d yes, all back in %v", yes.Load(), took.Round(time.Millisecond))
	if yes.Load() != 0 || took > 3*time.Second {
		t.Errorf("a frozen Redis: %d of 100 said it answers, back in %v (bound 300ms each, shared)", yes.Load(), took)
	}
}

// TestAnswersGivesThePingTwiceTheLimit: Answers(within) gives its PING
// twice within, so that a process starved of CPU (its PING's write or its
// reading of the answer late by up to within) does not take a running
// Redis for a frozen one; a PING that gets no answer in that time says
// Redis does not answer. The PING is a stand-in here (a real process
// cannot starve itself on cue: bucket/TestThousandsOfHandlesOneClient,
// 6,600 callers under -race beside a busy loop, met it, the PING's write
// timing out at 1.1-2.1 s).
func TestAnswersGivesThePingTwiceTheLimit(t *testing.T) {
	srv := redistest.New(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	const within = 100 * time.Millisecond
	for _, tc := range []struct {
		name   string
		answer time.Duration // when the PING answers; 0: never
		want   bool
	}{
		{"answered past the limit, within twice it", within * 3 / 2, true},
		{"never answered", 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := Acquire(rdb)
			defer h.Release()
			var gave atomic.Int64
			h.reach.amu.Lock()
			h.reach.aat = time.Time{}
			h.reach.aping = func(ctx context.Context) error {
				if dl, ok := ctx.Deadline(); ok {
					gave.Store(int64(time.Until(dl)))
				}
				if tc.answer == 0 {
					<-ctx.Done()
					return ctx.Err()
				}
				select {
				case <-time.After(tc.answer):
					return nil
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			h.reach.amu.Unlock()
			if got := h.Answers(context.Background(), within); got != tc.want {
				t.Errorf("Answers = %v, want %v", got, tc.want)
			}
			if g := time.Duration(gave.Load()); g <= within || g > 2*within {
				t.Errorf("the PING was given %v, want twice within (%v)", g, 2*within)
			}
		})
	}
}

// TestRepliedSince: a reply to a call that left at or after t says Redis
// ran after t; earlier replies do not, and a late note of an earlier
// reply does not undo a later one.
func TestRepliedSince(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer rdb.Close()
	h := Acquire(rdb)
	defer h.Release()
	t0 := time.Now()
	if h.RepliedSince(t0.Add(-time.Hour)) {
		t.Fatal("RepliedSince before any reply")
	}
	h.Replied(t0)
	h.Replied(t0.Add(-time.Second))
	if !h.RepliedSince(t0) || h.RepliedSince(t0.Add(time.Microsecond)) {
		t.Errorf("after a reply to a call sent at t0: since t0 %v (want true), since t0 + 1 µs %v (want false)", h.RepliedSince(t0), h.RepliedSince(t0.Add(time.Microsecond)))
	}
}
