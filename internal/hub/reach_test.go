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

// TestAnswersAfterStarvation: a PING this process saw fail late (its
// goroutine ran past the read's deadline, as in a process starved of CPU,
// while Redis's answer sat unread) is asked once more; one that failed on
// time is not. The PING is a stand-in here: a real process cannot starve
// itself on cue (bucket/TestThousandsOfHandlesOneClient met it in a
// loaded CI run).
func TestAnswersAfterStarvation(t *testing.T) {
	srv := redistest.New(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	// A bound of 1 s: a process seen late by more than 100 ms is starved;
	// the late PING here comes back 500 ms late.
	const within = time.Second
	for _, tc := range []struct {
		name  string
		late  bool // the first PING comes back past the bound
		want  bool
		calls int32
	}{
		{"failed late: asked again", true, true, 2},
		{"failed on time: not asked again", false, false, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := Acquire(rdb)
			defer h.Release()
			var calls atomic.Int32
			h.reach.amu.Lock()
			h.reach.aat = time.Time{}
			h.reach.aping = func(ctx context.Context) error {
				if calls.Add(1) > 1 {
					return nil // the second: the process runs again
				}
				<-ctx.Done()
				if tc.late {
					time.Sleep(within / 2) // the goroutine ran late
				}
				return ctx.Err()
			}
			h.reach.amu.Unlock()
			if got := h.Answers(context.Background(), within); got != tc.want || calls.Load() != tc.calls {
				t.Errorf("Answers = %v after %d PINGs, want %v after %d", got, calls.Load(), tc.want, tc.calls)
			}
		})
	}
}
