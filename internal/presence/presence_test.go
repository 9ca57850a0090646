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
	// Age a's trace past the window, as Redis time would, and the set's
	// birth: it is no longer young.
	if err := rdb.ZAdd(ctx, "p:{x}:procs", redisZ(a.member, time.Now().Add(-Window-time.Second))).Err(); err != nil {
		t.Fatal(err)
	}
	if err := rdb.Del(ctx, "p:{x}:procs:born").Err(); err != nil {
		t.Fatal(err)
	}
	if err := b.Send(ctx); err != nil {
		t.Fatal(err)
	}
	if got := b.Count(); got != 2 {
		t.Errorf("a trace older than the window, 2 read within it: count %d, want 2", got)
	}
	// A Window after the read of 2, the count falls.
	clock := time.Now().Add(Window + time.Millisecond)
	b.now = func() time.Time { return clock }
	if err := b.Send(ctx); err != nil {
		t.Fatal(err)
	}
	if got := b.Count(); got != 1 {
		t.Errorf("a trace older than the window, a Window on: count %d, want 1", got)
	}
	if ttl := rdb.PTTL(ctx, "p:{x}:procs").Val(); ttl <= 0 || ttl > 2*Window {
		t.Errorf("set's TTL %v, want in (0, %v]", ttl, 2*Window)
	}
}

// TestCountAfterRestart: Redis restarted empty (the traces gone, the
// processes tracing themselves again one by one) does not make a process
// count fewer processes than it read within Window: it would take, on
// its local share, the share of fewer. (semaphore/TestFallbackFleet,
// 4_killed, beside two busy loops: workers whose first trace after the
// restart read 1 fell back again with the whole capacity as their share,
// a fleet peak of 8 of 4.)
func TestCountAfterRestart(t *testing.T) {
	srv := redistest.New(t)
	rdb := srv.Client()
	defer rdb.Close()
	ctx := context.Background()
	ts := []*Trace{New(rdb, "p:{y}:procs"), New(rdb, "p:{y}:procs"), New(rdb, "p:{y}:procs")}
	for range 2 {
		for _, tr := range ts {
			if err := tr.Send(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}
	if got := ts[0].Count(); got != 3 {
		t.Fatalf("three traces: count %d, want 3", got)
	}
	if err := rdb.FlushAll(ctx).Err(); err != nil { // as an empty restart
		t.Fatal(err)
	}
	if err := ts[0].Send(ctx); err != nil {
		t.Fatal(err)
	}
	if got := ts[0].Count(); got != 3 {
		t.Errorf("the first trace after the traces were lost: count %d, want still 3", got)
	}
	// However long since the count of 3, while the set is young (a
	// restart that took seconds).
	clock := time.Now().Add(2 * Window)
	ts[0].now = func() time.Time { return clock }
	if err := ts[0].Send(ctx); err != nil {
		t.Fatal(err)
	}
	if got := ts[0].Count(); got != 3 {
		t.Errorf("a young set, %v after the count of 3: count %d, want still 3", 2*Window, got)
	}
	// A window after its birth the set counts: the others did not come back.
	if err := rdb.Del(ctx, "p:{y}:procs:born").Err(); err != nil { // as its PX would
		t.Fatal(err)
	}
	if err := ts[0].Send(ctx); err != nil {
		t.Fatal(err)
	}
	if got := ts[0].Count(); got != 1 {
		t.Errorf("a set a window old with one trace: count %d, want 1", got)
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
