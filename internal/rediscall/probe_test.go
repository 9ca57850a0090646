package rediscall

import (
	"context"
	"errors"
	"net"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestProbe: a probe names "connection refused" where nothing listens,
// and says nothing where it cannot tell (a failover client's placeholder
// address) or where the server is there.
func TestProbe(t *testing.T) {
	ctx := context.Background()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	up := l.Addr().String()
	down, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gone := down.Addr().String()
	down.Close()
	defer l.Close()
	for _, c := range []struct {
		rdb     redis.UniversalClient
		refused bool
	}{
		{redis.NewClient(&redis.Options{Addr: up}), false},
		{redis.NewClient(&redis.Options{Addr: gone}), true},
		{redis.NewFailoverClient(&redis.FailoverOptions{MasterName: "m", SentinelAddrs: []string{gone}}), false},
	} {
		err := Probe(ctx, c.rdb)
		if got := errors.Is(err, syscall.ECONNREFUSED); got != c.refused {
			t.Errorf("Probe of %T = %v, want refused %v", c.rdb, err, c.refused)
		}
		if !c.refused && err != nil {
			t.Errorf("Probe of %T = %v, want nil", c.rdb, err)
		}
		c.rdb.Close()
	}
}
