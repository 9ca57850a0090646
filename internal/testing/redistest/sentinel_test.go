package redistest_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// TestSentinelFailover: a write acknowledged by the replica (WAIT) is
// readable after the master is SIGKILLed and the sentinels promote the
// replica, through the same failover client, which then writes to the new
// master.
func TestSentinelFailover(t *testing.T) {
	master := redistest.New(t)
	master.RequireReal(t)
	replica := redistest.NewReplica(t, master)
	ss := redistest.NewSentinels(t, master, redistest.SentinelConfig{DownAfter: 500 * time.Millisecond, FailoverTimeout: 2 * time.Second})
	if got := ss.MasterAddrs(context.Background()); len(got) != 3 || got[0] != master.Addr() {
		t.Fatalf("sentinels name %v, want 3 naming %s", got, master.Addr())
	}
	rdb := ss.Client()
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := rdb.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if n, err := rdb.Wait(ctx, 1, 5000).Result(); err != nil || n != 1 {
		t.Fatalf("WAIT 1: %d replicas, %v", n, err)
	}

	killed := time.Now()
	if err := master.Kill(); err != nil {
		t.Fatal(err)
	}
	now, err := ss.WaitFailover(ctx, master.Addr())
	if err != nil {
		t.Fatal(err)
	}
	if now != replica.Addr() {
		t.Fatalf("sentinels promoted %s, want the replica %s", now, replica.Addr())
	}
	t.Logf("failover done %v after the kill", time.Since(killed).Round(time.Millisecond))
	// The client may still hold a dead connection or an old address for
	// a moment: retry the read, bounded by ctx.
	var v string
	for {
		v, err = rdb.Get(ctx, "k").Result()
		if err == nil || errors.Is(err, redis.Nil) || ctx.Err() != nil {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if err != nil || v != "v" {
		t.Fatalf("after failover: GET k = %q, %v; want the acknowledged write", v, err)
	}
	if err := rdb.Set(ctx, "k2", "v2", 0).Err(); err != nil {
		t.Fatalf("write to the new master: %v", err)
	}
	rc := replica.Client()
	defer rc.Close()
	if role, err := rc.Do(ctx, "ROLE").Slice(); err != nil || role[0] != "master" {
		t.Fatalf("the replica's ROLE is %v (%v), want master", role, err)
	}
}
