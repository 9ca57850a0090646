package semaphore

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/internal/testing/testkit"
)

// env is one test's redis-server and client.
type env struct {
	srv *redistest.Server
	rdb *redis.Client
}

func newEnv(t *testing.T) *env {
	t.Helper()
	srv := redistest.New(t)
	rdb := srv.Client()
	t.Cleanup(func() { rdb.Close() })
	return &env{srv: srv, rdb: rdb}
}

// sem opens a Semaphore on its own client (as another process would) and
// closes both at cleanup.
func (e *env) sem(t *testing.T, cfg Config) *Semaphore {
	t.Helper()
	rdb := e.srv.Client()
	s, err := New(rdb, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		s.Close()
		rdb.Close()
	})
	return s
}

// waitFor polls cond until it holds, failing t after within.
var waitFor = testkit.WaitFor

func acquire(t *testing.T, s *Semaphore, within time.Duration) *Permit {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	p, err := s.Acquire(ctx)
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	return p
}

// queueLen is the number of waiters in Redis.
func queueLen(t *testing.T, rdb *redis.Client, s *Semaphore) int64 {
	t.Helper()
	n, err := rdb.ZCard(context.Background(), s.keys[1]).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func holdersLen(t *testing.T, rdb *redis.Client, s *Semaphore) int64 {
	t.Helper()
	n, err := rdb.ZCard(context.Background(), s.keys[0]).Result()
	if err != nil {
		t.Fatal(err)
	}
	return n - queueLen(t, rdb, s)
}

// stateLeft is the number of keys in Redis other than semaphores'
// configs, which outlive their state (see stored.go).
func (e *env) stateLeft(t *testing.T) int {
	t.Helper()
	keys, err := e.rdb.Keys(context.Background(), "*").Result()
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, k := range keys {
		if !strings.HasSuffix(k, ":"+suffixConfig) {
			n++
		}
	}
	return n
}

// releaseGone releases p and waits until Redis no longer has its lease:
// Release returns before the release reaches Redis.
func releaseGone(t *testing.T, rdb *redis.Client, p *Permit) {
	t.Helper()
	if err := p.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Second, "the release to reach Redis", func() bool {
		err := rdb.ZScore(context.Background(), p.s.keys[0], p.id).Err()
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		return errors.Is(err, redis.Nil)
	})
}

// acquireReleaseAll takes n permits of s at once and releases them all;
// Release returns before Redis has the releases.
func acquireReleaseAll(t *testing.T, s *Semaphore, n int) {
	t.Helper()
	var held []*Permit
	for range n {
		held = append(held, acquire(t, s, time.Second))
	}
	for _, p := range held {
		if err := p.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}
