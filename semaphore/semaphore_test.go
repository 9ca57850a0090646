package semaphore

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
)

func TestNewValidates(t *testing.T) {
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer rdb.Close()
	plain := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})
	defer plain.Close()
	var nilClient *redis.Client
	for _, tc := range []struct {
		name string
		rdb  redis.UniversalClient
		cfg  Config
	}{
		{"nil client", nil, Config{Name: "a", Capacity: 1}},
		{"typed nil client", nilClient, Config{Name: "a", Capacity: 1}},
		{"empty name", rdb, Config{Capacity: 1}},
		{"zero capacity", rdb, Config{Name: "a"}},
		{"negative capacity", rdb, Config{Name: "a", Capacity: -1}},
		{"negative lease", rdb, Config{Name: "a", Capacity: 1, LeaseTTL: -time.Second}},
		{"tiny lease", rdb, Config{Name: "a", Capacity: 1, LeaseTTL: time.Millisecond}},
		{"huge lease", rdb, Config{Name: "a", Capacity: 1, LeaseTTL: 25 * time.Hour}},
		{"negative queue ttl", rdb, Config{Name: "a", Capacity: 1, QueueTTL: -1}},
		{"negative max queue", rdb, Config{Name: "a", Capacity: 1, MaxQueue: -1}},
		{"brace in prefix", rdb, Config{Name: "a", Capacity: 1, KeyPrefix: "x{y"}},
		{"client ignoring deadlines", plain, Config{Name: "a", Capacity: 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := New(tc.rdb, tc.cfg)
			if err == nil {
				s.Close()
				t.Fatal("New accepted it")
			}
			if !errors.Is(err, errConfig) || !errors.Is(err, sluice.ErrConfig) {
				t.Fatalf("%v: not errConfig", err)
			}
			t.Log(err)
		})
	}
	// Redis being unreachable is not New's business.
	s, err := New(rdb, Config{Name: "a", Capacity: 1})
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
}

func TestKeys(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{"crawler", "sluice:{crawler}:leases"},
		{"a{b}c", "sluice:{a%7Bb%7Dc}:leases"},
		{"%7B", "sluice:{%257B}:leases"},
		{"}", "sluice:{%7D}:leases"},
		{"a:b", "sluice:{a:b}:leases"},
		{"\x00\xff", "sluice:{\x00\xff}:leases"},
	} {
		if got := keyBase("sluice", tc.name) + suffixLeases; got != tc.want {
			t.Errorf("name %q: key %q, want %q", tc.name, got, tc.want)
		}
	}
	// Distinct names, distinct tags: escaping is injective.
	names := []string{"{", "%7B", "%257B", "}", "%7D", "%", "%25", "{}", "", "a", "a}"}
	seen := map[string]string{}
	for _, n := range names {
		k := keyBase("sluice", n)
		if prev, ok := seen[k]; ok {
			t.Errorf("names %q and %q share keys %q", prev, n, k)
		}
		seen[k] = n
	}
}

func TestAcquireRelease(t *testing.T) {
	e := newEnv(t)
	s := e.sem(t, Config{Name: t.Name(), Capacity: 2})
	ctx := context.Background()
	p1 := acquire(t, s, time.Second)
	p2 := acquire(t, s, time.Second)
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := s.Acquire(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("third Acquire on capacity 2: %v, want deadline exceeded", err)
	}
	if err := p1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	p3 := acquire(t, s, time.Second)
	for _, p := range []*Permit{p2, p3} {
		if err := p.Release(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// An idle semaphore leaves nothing behind but its config, which
	// expires too.
	if n := e.stateLeft(t); n != 0 {
		t.Fatalf("%d keys besides the config left after every release", n)
	}
	if ttl := e.rdb.PTTL(ctx, s.keys[4]).Val(); ttl <= 0 || ttl > keepConfig {
		t.Fatalf("config TTL %v, want up to %v", ttl, keepConfig)
	}
}

func TestDo(t *testing.T) {
	e := newEnv(t)
	s := e.sem(t, Config{Name: t.Name(), Capacity: 1})
	var l sluice.Limiter = s
	boom := errors.New("boom")
	ctx := context.Background()
	if err := l.Do(ctx, func(context.Context) error { return boom }); !errors.Is(err, boom) {
		t.Fatalf("Do returned %v, want fn's error", err)
	}
	func() {
		defer func() { recover() }()
		_ = l.Do(ctx, func(context.Context) error { panic("fn panics") })
	}()
	// The panic released the place.
	if err := l.Do(ctx, func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}
}
