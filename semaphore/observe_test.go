package semaphore

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
)

// recorder is an Observer that keeps every event.
type recorder struct {
	mu     sync.Mutex
	events []sluice.Event
}

func (r *recorder) Observe(e sluice.Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

// count is the events of result res and reason why, queued or not.
func (r *recorder) count(res sluice.Result, why string, queued bool) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if e.Result == res && e.Reason == why && e.Queued == queued {
			n++
		}
	}
	return n
}

func (r *recorder) all() []sluice.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]sluice.Event(nil), r.events...)
}

// logBuffer is a Logger whose output a test reads.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }

// TestObserverAndStats: every Acquire, AcquireN and Do is reported once
// with its result, reason and whether it queued, and Stats counts the
// same: grants at once and after a wait, a full queue, a weight above the
// capacity, a cancellation, Close; Held follows the weights held.
// ticketKnown reports that a waiter of s has heard its ticket: Redis
// queued it and the reply saying so has been applied. An Event's Queued is
// what the process heard; the arrival of a process whose callers are busy
// goes through the dispatcher, whose reply can come after Redis shows the
// waiter queued.
func ticketKnown(s *Semaphore) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, w := range s.waiters {
		if w.ticket > 0 {
			return true
		}
	}
	return false
}

func TestObserverAndStats(t *testing.T) {
	e := newEnv(t)
	rec := &recorder{}
	s := e.sem(t, Config{Name: t.Name(), Capacity: 3, MaxQueue: 1, Observer: rec})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	p1 := acquire(t, s, 5*time.Second)
	if _, err := s.AcquireN(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.Held != 3 || st.Granted != 2 || st.Waiting != 0 {
		t.Fatalf("Stats with weights 1 and 2 held: %+v", st)
	}
	// One waits; the next finds the queue full; a weight of 4 never fits.
	got := make(chan *Permit, 1)
	go func() {
		p, err := s.Acquire(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- p
	}()
	waitFor(t, 5*time.Second, "a waiter in Redis", func() bool {
		return s.Stats().Waiting == 1 && queueLen(t, e.rdb, s) == 1 && ticketKnown(s)
	})
	if _, err := s.Acquire(ctx); !errors.Is(err, sluice.ErrQueueFull) {
		t.Fatalf("Acquire with the queue full = %v", err)
	}
	if _, err := s.AcquireN(ctx, 4); !errors.Is(err, sluice.ErrCostExceedsCapacity) {
		t.Fatalf("AcquireN(4) of 3 = %v", err)
	}
	if err := p1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	p3 := <-got
	// Full again: a waiter that gives up.
	gone, giveUp := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := s.Acquire(gone)
		done <- err
	}()
	waitFor(t, 5*time.Second, "a second waiter in Redis", func() bool {
		return s.Stats().Waiting == 1 && queueLen(t, e.rdb, s) == 1 && ticketKnown(s)
	})
	giveUp()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("abandoned Acquire = %v", err)
	}
	if err := p3.Release(ctx); err != nil {
		t.Fatal(err)
	}
	// Do reports its Acquire once, granted at once once the waiter that
	// gave up has left Redis (p3's release may have granted it first).
	waitFor(t, 5*time.Second, "the abandoned waiter to leave", func() bool {
		return queueLen(t, e.rdb, s) == 0 && holdersLen(t, e.rdb, s) == 1
	})
	if err := s.Do(ctx, func(context.Context) error { return nil }); err != nil {
		t.Fatal(err)
	}

	st := s.Stats()
	want := Stats{Held: 2, Granted: 4, Refused: 2, Canceled: 1}
	if st != want {
		t.Errorf("Stats %+v, want %+v", st, want)
	}
	for _, c := range []struct {
		res    sluice.Result
		why    string
		queued bool
		want   int
	}{
		{sluice.Granted, "", false, 3},
		{sluice.Granted, "", true, 1},
		{sluice.Refused, "queue_full", false, 1},
		{sluice.Refused, "cost_exceeds_capacity", false, 1},
		{sluice.Canceled, "", true, 1},
	} {
		if n := rec.count(c.res, c.why, c.queued); n != c.want {
			t.Errorf("%d events %v %q queued=%v, want %d", n, c.res, c.why, c.queued, c.want)
		}
	}
	events := rec.all()
	if len(events) != 7 {
		t.Errorf("%d events, want 7: %+v", len(events), events)
	}
	for _, ev := range events {
		if ev.Limiter != "semaphore" || ev.Name != t.Name() {
			t.Errorf("event %+v: wrong limiter or name", ev)
		}
		if ev.Queued && ev.Wait <= 0 {
			t.Errorf("event %+v: queued without a wait", ev)
		}
	}

	s.Close()
	if _, err := s.Acquire(ctx); !errors.Is(err, sluice.ErrClosed) {
		t.Fatalf("Acquire after Close = %v", err)
	}
	if n := rec.count(sluice.Failed, "closed", false); n != 1 {
		t.Errorf("%d closed failures observed, want 1", n)
	}
	// Close ends the permits held: not leases lost.
	if st := s.Stats(); st.Held != 0 || st.Failed != 1 || st.LeasesLost != 0 || st.Waiting != 0 {
		t.Errorf("Stats after Close %+v", st)
	}
}

// TestLeaseLost: a lease that Redis no longer has is lost at the next
// renewal: Stats counts it, Held drops, and the Logger says so.
func TestLeaseLost(t *testing.T) {
	e := newEnv(t)
	var logs logBuffer
	s := e.sem(t, Config{Name: t.Name(), Capacity: 2, LeaseTTL: 300 * time.Millisecond, Logger: logs.logger()})
	p := acquire(t, s, 5*time.Second)
	keep := acquire(t, s, 5*time.Second)
	if err := e.rdb.ZRem(context.Background(), s.keys[0], p.id).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.Lost():
	case <-time.After(5 * time.Second):
		t.Fatal("the lease removed from Redis was not lost within 5 s")
	}
	if st := s.Stats(); st.LeasesLost != 1 || st.Held != 1 {
		t.Errorf("Stats after a lease lost %+v, want 1 lost, 1 held", st)
	}
	if err := p.Release(context.Background()); !errors.Is(err, ErrLeaseLost) {
		t.Errorf("Release of a lost permit = %v", err)
	}
	if out := logs.String(); !strings.Contains(out, "lease lost") || !strings.Contains(out, p.id) {
		t.Errorf("log lacks the lost lease:\n%s", out)
	}
	if err := keep.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	if st := s.Stats(); st.LeasesLost != 1 || st.Held != 0 {
		t.Errorf("Stats at the end %+v", st)
	}
}

// TestLogger: a process that follows a capacity changed in Redis says so,
// one whose Capacity is refused says why once, not at every call, and
// Redis failing and answering again are told once each.
func TestLogger(t *testing.T) {
	e := newEnv(t)
	var logs logBuffer
	rec := &recorder{}
	cfg := Config{Name: t.Name(), Capacity: 3}
	admin := e.sem(t, cfg)
	logged := cfg
	logged.Logger = logs.logger()
	s := e.sem(t, logged)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p := acquire(t, s, 5*time.Second)
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := admin.SetCapacity(ctx, 5); err != nil {
		t.Fatal(err)
	}
	p = acquire(t, s, 5*time.Second)
	if err := p.Release(ctx); err != nil {
		t.Fatal(err)
	}
	other := logged
	other.Capacity, other.Observer = 7, rec
	o := e.sem(t, other)
	for range 2 {
		if _, err := o.Acquire(ctx); !errors.Is(err, sluice.ErrConfigMismatch) {
			t.Fatalf("Acquire with another Capacity = %v", err)
		}
	}
	if n := rec.count(sluice.Failed, "config_mismatch", false); n != 2 {
		t.Errorf("%d config_mismatch failures observed, want 2", n)
	}
	out := logs.String()
	if !strings.Contains(out, "following the semaphore capacity in force") || !strings.Contains(out, "from=3 to=5") {
		t.Errorf("log lacks the capacity followed:\n%s", out)
	}
	if n := strings.Count(out, "differs from the one in force"); n != 1 || !strings.Contains(out, "mine=7 in_force=5") {
		t.Errorf("the refusal logged %d times, want once naming both:\n%s", n, out)
	}

	e.srv.RequireReal(t)
	if err := e.srv.Kill(); err != nil {
		t.Fatal(err)
	}
	short, stop := context.WithTimeout(ctx, 2*time.Second)
	_, err := s.Acquire(short)
	stop()
	if err == nil {
		t.Fatal("Acquire with Redis down succeeded")
	}
	if err := e.srv.Restart(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "an Acquire once Redis is back", func() bool {
		short, stop := context.WithTimeout(ctx, time.Second)
		defer stop()
		p, err := s.Acquire(short)
		if err != nil {
			return false
		}
		return p.Release(short) == nil
	})
	out = logs.String()
	if n := strings.Count(out, "calls to Redis fail"); n != 1 {
		t.Errorf("Redis failing logged %d times, want 1:\n%s", n, out)
	}
	if !strings.Contains(out, "calls to Redis succeed again") {
		t.Errorf("log lacks Redis answering again:\n%s", out)
	}
}

// TestInspect: what every process sees, in one round trip: the capacity
// in force (also for a process configured otherwise), the weight and
// permits held by two processes, the waiters and the weight the first
// waits for; leases of a dead process are counted apart until a call
// clears them.
func TestInspect(t *testing.T) {
	e := newEnv(t)
	// Long TTLs: no beat runs during the test, so the dead leases written
	// below stay until a call of this test clears them.
	cfg := Config{Name: t.Name(), Capacity: 5, LeaseTTL: 30 * time.Second, QueueTTL: 30 * time.Second}
	a, b := e.sem(t, cfg), e.sem(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	in, err := a.Inspect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if in.Stored || in.Capacity != 5 || in.Held+in.Holders+in.Queued+in.HeadWeight+in.Expired != 0 || in.Now.IsZero() {
		t.Errorf("inspection of an unused semaphore %+v", in)
	}

	a2, err := a.AcquireN(ctx, 2)
	if err != nil {
		t.Fatal(err)
	}
	a1 := acquire(t, a, 5*time.Second)
	b1 := acquire(t, b, 5*time.Second)
	got := make(chan *Permit, 2)
	go func() {
		p, err := b.AcquireN(ctx, 3)
		if err != nil {
			t.Error(err)
		}
		got <- p
	}()
	waitFor(t, 5*time.Second, "the heavy waiter in Redis", func() bool { return queueLen(t, e.rdb, b) == 1 })
	go func() {
		p, err := a.Acquire(ctx)
		if err != nil {
			t.Error(err)
		}
		got <- p
	}()
	waitFor(t, 5*time.Second, "two waiters in Redis", func() bool { return queueLen(t, e.rdb, b) == 2 })

	want := Inspection{Capacity: 5, Stored: true, Held: 4, Holders: 3, Queued: 2, HeadWeight: 3}
	check := func(what string, want Inspection, s *Semaphore) {
		t.Helper()
		in, err := s.Inspect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if d := time.Since(in.Now); d < -time.Second || d > time.Second {
			t.Errorf("%s: Redis clock %v, %v from this one", what, in.Now, d)
		}
		in.Now = time.Time{}
		if in != want {
			t.Errorf("%s: %+v, want %+v", what, in, want)
		}
	}
	check("two processes", want, b)
	// A process configured otherwise sees the same.
	check("a process of another Capacity", want, e.sem(t, Config{Name: t.Name(), Capacity: 9}))

	// A dead process's holder of weight 2 and its waiter at the head,
	// their leases ended: left for the next call to clear.
	tm, err := e.rdb.Time(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	past := float64(tm.Add(-time.Second).UnixMicro())
	dead, deadWaiter := "deadproc:1:2", "deadproc:2:4"
	if _, err := e.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.ZAdd(ctx, a.keys[0], redis.Z{Score: past, Member: dead}, redis.Z{Score: past, Member: deadWaiter})
		p.HSet(ctx, a.keys[3], dead, "2")
		p.ZAdd(ctx, a.keys[1], redis.Z{Score: 0, Member: deadWaiter})
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want.Expired = 2
	check("with dead leases", want, a)

	// The release clears the dead leases and grants the heavy waiter; the
	// light one waits for the next.
	if err := a2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	heavy := <-got
	check("the heavy waiter granted", Inspection{Capacity: 5, Stored: true, Held: 5, Holders: 3, Queued: 1, HeadWeight: 1}, a)
	if err := a1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	light := <-got
	check("the light waiter granted", Inspection{Capacity: 5, Stored: true, Held: 5, Holders: 3}, b)
	for _, p := range []*Permit{heavy, light, b1} {
		releaseGone(t, e.rdb, p)
	}
	check("idle", Inspection{Capacity: 5, Stored: true}, a)
	if n, err := e.rdb.HLen(ctx, a.keys[3]).Result(); err != nil || n != 0 {
		t.Errorf("weights left: %d, %v", n, err)
	}
}

// TestInspectReadsOwnReleases: Release returns before Redis has the
// release; Inspect waits for this process's own, so it reads them back.
func TestInspectReadsOwnReleases(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.sem(t, Config{Name: t.Name(), Capacity: 20})
	for round := range 5 {
		acquireReleaseAll(t, s, 20)
		in, err := s.Inspect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if in.Held != 0 || in.Holders != 0 {
			t.Fatalf("round %d: Inspect right after 20 releases: %d held by %d holders, want none", round, in.Held, in.Holders)
		}
	}
}

// TestReleaseNotHeldCounted: a release that Redis finds no longer held (the
// lease ended there unnoticed) counts as a lease lost and is logged, though
// Release itself, which does not wait for Redis, returned nil.
func TestReleaseNotHeldCounted(t *testing.T) {
	e := newEnv(t)
	var logs logBuffer
	// A 10 s beat: the renewal cannot notice the loss before the release.
	s := e.sem(t, Config{Name: t.Name(), Capacity: 1, LeaseTTL: 30 * time.Second, QueueTTL: 30 * time.Second, Logger: logs.logger()})
	p := acquire(t, s, 5*time.Second)
	if err := e.rdb.ZRem(context.Background(), s.keys[0], p.id).Err(); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(context.Background()); err != nil {
		t.Fatalf("Release of a permit whose loss nobody noticed yet: %v, want nil", err)
	}
	waitFor(t, 5*time.Second, "the loss counted", func() bool { return s.Stats().LeasesLost == 1 })
	if out := logs.String(); !strings.Contains(out, "no longer held") || !strings.Contains(out, p.id) {
		t.Errorf("log lacks the release not held:\n%s", out)
	}
}
