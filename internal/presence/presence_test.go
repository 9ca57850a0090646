package presence

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// TestCount: each trace counts once however often it is sent, and one
// not sent again within Window leaves the count.
func TestCount(t *testing.T) {
	srv := redistest.New(t)
	rdb := srv.Client()
	defer rdb.Close()
	ctx := context.Background()
	a, b := New(rdb, "p:{x}:procs"), New(rdb, "p:{x}:procs")
	if a.Count() != 0 {
		t.Fatalf("Count before any Send: %d", a.Count())
	}
	for range 3 {
		if err := a.Send(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if got := a.Count(); got != 1 {
		t.Errorf("one trace sent thrice: count %d, want 1", got)
	}
	if err := b.Send(ctx); err != nil {
		t.Fatal(err)
	}
	if got := b.Count(); got != 2 {
		t.Errorf("two traces: count %d, want 2", got)
	}
	// Age a's trace past the window, as Redis time would.
	if err := rdb.ZAdd(ctx, "p:{x}:procs", redisZ(a.member, time.Now().Add(-Window-time.Second))).Err(); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(ctx); err != nil {
		t.Fatal(err)
	}
	if got := b.Count(); got != 1 {
		t.Errorf("a trace older than the window: count %d, want 1", got)
	}
	if ttl := rdb.PTTL(ctx, "p:{x}:procs").Val(); ttl <= 0 || ttl > 2*Window {
		t.Errorf("set's TTL %v, want in (0, %v]", ttl, 2*Window)
	}
}

// TestDue: one caller in each Every claims the trace.
func TestDue(t *testing.T) {
	tr := New(nil, "k")
	now := time.Now()
	if !tr.Due(now) || tr.Due(now) || tr.Due(now.Add(Every-time.Millisecond)) {
		t.Error("Due claimed twice within Every, or not at first")
	}
	if !tr.Due(now.Add(Every)) {
		t.Error("Due not claimed after Every")
	}
}

func redisZ(member string, at time.Time) redis.Z {
	return redis.Z{Score: float64(at.UnixMilli()), Member: member}
}
