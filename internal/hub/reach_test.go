package hub

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/internal/testkit"
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
