package bucket_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/redistest"
)

func TestSmoke(t *testing.T) {
	srv := redistest.New(t)
	rdb := srv.Client()
	defer rdb.Close()
	cfg := bucket.Config{Capacity: 5, RefillAmount: 1, RefillFrequency: 5 * time.Millisecond}
	b := newBucket(t, rdb, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	start := time.Now()
	grants := enterAll(ctx, b, 50, 4)
	res := checkGrants(t, grants, limitOf(b.Config()))
	polls, queued, rts := 0, 0, 0
	for _, g := range grants {
		polls += g.Polls
		rts += g.RoundTrips
		if g.Polls > 0 {
			queued++
		}
	}
	t.Logf("%v in %v; queued %d polls %d (%.2f/queued), rt/grant %.2f; sched %+v", res, time.Since(start), queued, polls, float64(polls)/float64(queued), float64(rts)/float64(len(grants)), b.SchedulerStats())
}
