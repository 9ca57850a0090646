package bucket_test

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// startCluster starts a Redis Cluster of three masters, each a
// redistest server with its own directory (so its nodes.conf is its own),
// and waits until every node reports cluster_state:ok.
func startCluster(t *testing.T) []string {
	t.Helper()
	cli, err := exec.LookPath("redis-cli")
	if err != nil {
		t.Skip("redis-cli not on PATH")
	}
	var addrs []string
	for range 3 {
		s := redistest.New(t, "--cluster-enabled", "yes", "--cluster-node-timeout", "1000",
			"--cluster-config-file", "nodes.conf")
		s.RequireReal(t)
		addrs = append(addrs, s.Addr())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, cli, append(append([]string{"--cluster", "create"}, addrs...), "--cluster-yes")...).CombinedOutput()
	if err != nil {
		t.Fatalf("redis-cli --cluster create: %v\n%s", err, out)
	}
	for _, a := range addrs {
		c := redis.NewClient(&redis.Options{Addr: a})
		waitFor(t, 20*time.Second, "cluster_state:ok on "+a, func() bool {
			info, _ := c.ClusterInfo(context.Background()).Result()
			return strings.Contains(info, "cluster_state:ok")
		})
		c.Close()
	}
	return addrs
}

// TestCluster: on a Redis Cluster of three masters, through a
// ClusterClient, the bucket works at saturation with the guarantee over
// every grant, and all keys of a bucket (whatever its name, braces
// included) hash to one slot, so its scripts never fail with CROSSSLOT.
func TestCluster(t *testing.T) {
	addrs := startCluster(t)
	rdb := redis.NewClusterClient(&redis.ClusterOptions{Addrs: addrs, ContextTimeoutEnabled: true, MaxRetries: -1})
	defer rdb.Close()
	ctx := withTimeout(t, 30*time.Second)

	for _, name := range []string{t.Name(), "a{b}c", "}{", "%7B"} {
		keys := keysFor(bucket.Config{Name: name})
		var slots []int64
		for _, k := range []string{keys.Queue, keys.State, keys.Slot, keys.Slot + "x", keys.Lock} {
			s, err := rdb.ClusterKeySlot(ctx, k).Result()
			if err != nil {
				t.Fatal(err)
			}
			slots = append(slots, s)
		}
		for _, s := range slots[1:] {
			if s != slots[0] {
				t.Errorf("bucket %q: keys in slots %v, want one slot", name, slots)
				break
			}
		}
	}

	cfg := bucket.Config{Name: t.Name(), Capacity: 5, RefillAmount: 1, RefillFrequency: 4 * time.Millisecond,
		LockTTL: 300 * time.Millisecond, MaxLateness: bucket.DefaultMaxLateness}
	b := newBucket(t, rdb, cfg)
	grants := enterAll(ctx, b, 20, 10)
	checkGrants(t, grants, cfg)
	queued := 0
	for _, g := range grants {
		if g.Position > 0 {
			queued++
		}
	}
	if queued < len(grants)/2 {
		t.Errorf("only %d of %d callers queued: not saturated", queued, len(grants))
	}
	// A second bucket whose name has braces lands in one slot too and works.
	cfg2 := cfg
	cfg2.Name = "a{b}c"
	b2 := newBucket(t, rdb, cfg2)
	checkGrants(t, enterAll(ctx, b2, 10, 3), cfg2)
	t.Logf("cluster of 3 masters: %d grants, %d queued", len(grants), queued)
}
