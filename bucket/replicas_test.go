package bucket_test

import (
	"context"
	"errors"
	"github.com/sluicehq/sluice"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// waits is how many WAIT commands srv has run (INFO commandstats).
func waits(t *testing.T, rdb *redis.Client) int {
	t.Helper()
	return int(calls(t, rdb, "wait"))
}

// TestReplicaAcks: with ReplicaAcks, a saturated bucket's callers are
// granted only after their writes reached the replica (every grant keeps
// the limit, and WAIT ran), and with the replica frozen, Enter fails with
// ErrNotReplicated within about ReplicaTimeout instead of starting a
// caller whose token a promoted replica would not know of.
func TestReplicaAcks(t *testing.T) {
	master := redistest.New(t)
	master.RequireReal(t)
	replica := redistest.NewReplica(t, master)
	rdb := master.Client()
	defer rdb.Close()
	cfg := bucket.Config{Name: t.Name(), Capacity: 5, RefillAmount: 1, RefillFrequency: 5 * time.Millisecond,
		// Generous: a loaded machine delays the replica's ack (a CI run on
		// this 2-vCPU VM once waited over 500 ms for one).
		ReplicaAcks: 1, ReplicaTimeout: 2 * time.Second}
	b := newBucket(t, rdb, cfg)
	ctx := withTimeout(t, 20*time.Second)
	before := waits(t, rdb)
	run, stop := context.WithTimeout(ctx, time.Second)
	grants, errs := saturate(run, b, 10)
	stop()
	if len(errs) > 0 {
		t.Fatalf("%d Enters failed with the replica up, first: %v", len(errs), errs[0])
	}
	checkGrants(t, grants, cfg)
	if n := waits(t, rdb) - before; n < len(grants)/2 {
		t.Errorf("%d WAITs for %d grants", n, len(grants))
	}
	// The callers saturate left behind leave in the background, each
	// leave a write with its own WAIT on the lane the next arrival takes:
	// with the replica frozen, a caller behind them waits out their WAITs
	// too (6.03 s, three of them, in a CI run). Let them drain first.
	waitFor(t, 10*time.Second, "the queue to drain and a grant with the replica up", func() bool {
		in, err := b.Inspect(ctx)
		return err == nil && in.Queued == 0 && b.Enter(ctx) == nil
	})
	if err := replica.Pause(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err := b.Enter(ctx)
	if !errors.Is(err, bucket.ErrNotReplicated) {
		t.Errorf("Enter with the replica frozen = %v, want ErrNotReplicated", err)
	}
	if d := time.Since(start); d > 2*cfg.ReplicaTimeout+2*time.Second {
		t.Errorf("Enter with the replica frozen took %v, want about the %v ReplicaTimeout", d, cfg.ReplicaTimeout)
	}
	if err := replica.Resume(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "grants once the replica is back", func() bool { return b.Enter(ctx) == nil })
}

// TestReplicaAcksNeedsOneMaster: New refuses ReplicaAcks with a client
// that may send WAIT to another node than the grant's, and bad values.
func TestReplicaAcksNeedsOneMaster(t *testing.T) {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}, ContextTimeoutEnabled: true})
	defer cc.Close()
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", ContextTimeoutEnabled: true})
	defer c.Close()
	base := bucket.Config{Name: "x", Capacity: 1, RefillAmount: 1, RefillFrequency: time.Second}
	for _, tc := range []struct {
		rdb  redis.UniversalClient
		edit func(*bucket.Config)
		want string
	}{
		{cc, func(c *bucket.Config) { c.ReplicaAcks = 1 }, "one master"},
		{c, func(c *bucket.Config) { c.ReplicaAcks = -1 }, "ReplicaAcks -1"},
		{c, func(c *bucket.Config) { c.ReplicaAcks = 1; c.ReplicaTimeout = time.Microsecond }, "ReplicaTimeout 1µs"},
	} {
		cfg := base
		tc.edit(&cfg)
		if _, err := bucket.New(tc.rdb, cfg); !errors.Is(err, sluice.ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("New(%T, %+v) = %v, want ErrConfig naming %q", tc.rdb, cfg, err, tc.want)
		}
	}
}

// BenchmarkReplicaAcks is one uncontended Enter with and without
// ReplicaAcks, against a master and a replica on loopback: the price of
// closing the failover gap.
func BenchmarkReplicaAcks(b *testing.B) {
	master := redistest.New(b)
	master.RequireReal(b)
	redistest.NewReplica(b, master)
	rdb := master.Client()
	defer rdb.Close()
	for _, acks := range []int{0, 1} {
		b.Run("acks="+strconv.Itoa(acks), func(b *testing.B) {
			bk, err := bucket.New(rdb, bucket.Config{Name: b.Name(), Capacity: 1 << 30, RefillAmount: 1 << 30, RefillFrequency: time.Millisecond, ReplicaAcks: acks})
			if err != nil {
				b.Fatal(err)
			}
			defer bk.Close()
			ctx := context.Background()
			for b.Loop() {
				if err := bk.Enter(ctx); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
