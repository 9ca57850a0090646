package bucket_test

import (
	"context"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// TestPushLaneSaturated: two Buckets (two processes' handles) hammer one
// bucket, so that callers arrive while others wait and take the push lane
// (MULTI/EXEC instead of enqueue.lua). The guarantee holds over every
// grant, slots follow tickets (FIFO across both lanes, among the callers
// that came on time for their slots), callers poll about
// once, and the lane was used: most arrivals were transactions, not
// scripts.
func TestPushLaneSaturated(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	rdbA, rdbB, admin := srv.Client(), srv.Client(), srv.Client()
	defer rdbA.Close()
	defer rdbB.Close()
	defer admin.Close()
	cfg := bucket.Config{Name: t.Name(), Capacity: 5, RefillAmount: 1, RefillFrequency: 4 * time.Millisecond}
	a, b := newBucket(t, rdbA, cfg), newBucket(t, rdbB, cfg)
	if err := admin.ConfigResetStat(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	ctx := withTimeout(t, time.Minute)
	var mu sync.Mutex
	var grants []loadgen.Grant
	var wg sync.WaitGroup
	for _, h := range []*bucket.Bucket{a, b} {
		wg.Go(func() {
			g := enterAll(ctx, h, 40, 5)
			mu.Lock()
			grants = append(grants, g...)
			mu.Unlock()
		})
	}
	wg.Wait()
	checkGrants(t, grants, cfg)

	ok := slices.DeleteFunc(slices.Clone(grants), func(g loadgen.Grant) bool { return !g.OK() })
	slices.SortFunc(ok, func(x, y loadgen.Grant) int { return int(x.Ticket - y.Ticket) })
	polls, queued := 0, 0
	var prev *loadgen.Grant // the last caller served on its own slot
	for i, g := range ok {
		if i > 0 && g.Ticket == ok[i-1].Ticket {
			t.Fatalf("ticket %d given twice", g.Ticket)
		}
		// A caller that woke too late for its slot took the next one,
		// behind later tickets, and one that claimed a slot another did
		// not come for took it ahead of them (design.md, "Overload"):
		// order is judged among the others, as the bench's analyses
		// judge it.
		if g.Retimes == 0 && g.Claims == 0 {
			if prev != nil && g.Slot < prev.Slot {
				t.Fatalf("ticket %d has slot %d, before ticket %d's %d: not FIFO", g.Ticket, g.Slot, prev.Ticket, prev.Slot)
			}
			prev = &ok[i]
		}
		if g.Position > 0 {
			queued++
			polls += g.Polls
		}
	}
	onTimePolls(t, ok)
	execs, scripts := calls(t, admin, "exec"), calls(t, admin, "evalsha")
	if execs < int64(len(ok))/4 || scripts > execs {
		t.Errorf("%d transactions and %d scripts for %d grants: the push lane was not used", execs, scripts, len(ok))
	}
	t.Logf("%d grants, %d queued, %.2f polls each; %d transactions, %d scripts (steps included)", len(ok), queued, float64(polls)/float64(max(queued, 1)), execs, scripts)
}

// calls is the calls count of one INFO commandstats row.
func calls(t *testing.T, rdb *redis.Client, name string) int64 {
	t.Helper()
	info, err := rdb.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(info, "\n") {
		rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+name+":calls=")
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	return 0
}
