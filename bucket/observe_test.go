package bucket_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/testing/redistest"
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

func (r *recorder) all() []sluice.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]sluice.Event(nil), r.events...)
}

func (r *recorder) count(res sluice.Result, reason string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, e := range r.events {
		if e.Result == res && (reason == "" || e.Reason == reason) {
			n++
		}
	}
	return n
}

// TestObserverAndStats: every call is reported once with its result, and
// Stats counts the same: grants (queued or not), a refusal by reason, a
// cancellation; Waiting is back to 0 after.
func TestObserverAndStats(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	rec := &recorder{}
	b := newBucket(t, rdb, bucket.Config{Name: t.Name(), Capacity: 2, RefillAmount: 1, RefillFrequency: 20 * time.Millisecond, MaxQueue: 3, Observer: rec})
	ctx := withTimeout(t, 10*time.Second)
	for range 6 {
		if err := b.Enter(ctx); err != nil {
			t.Fatal(err)
		}
	}
	// Three wait; a fourth is refused.
	slow := bucket.Config{Name: t.Name() + "-slow", Capacity: 1, RefillAmount: 1, RefillFrequency: time.Hour, MaxQueue: 2, Observer: rec}
	s := newBucket(t, rdb, slow)
	if err := s.Enter(ctx); err != nil {
		t.Fatal(err)
	}
	// Without a deadline: one of 10 s would see its turn an hour off and
	// be refused at once.
	gone, cancel := context.WithCancel(context.Background())
	done := make(chan error, 2)
	for range 2 {
		go func() { done <- s.Enter(gone) }()
	}
	waitFor(t, 5*time.Second, "two callers to wait", func() bool { return s.Stats().Waiting == 2 })
	if err := s.Enter(ctx); !errors.Is(err, sluice.ErrQueueFull) {
		t.Fatalf("third caller = %v, want sluice.ErrQueueFull", err)
	}
	cancel()
	for range 2 {
		<-done
	}
	if g := rec.count(sluice.Granted, ""); g != 7 {
		t.Errorf("%d grants observed, want 7", g)
	}
	if n := rec.count(sluice.Refused, "queue_full"); n != 1 {
		t.Errorf("%d queue_full refusals observed, want 1", n)
	}
	if n := rec.count(sluice.Canceled, ""); n != 2 {
		t.Errorf("%d cancellations observed, want 2", n)
	}
	st := s.Stats()
	if st.Granted != 1 || st.Refused != 1 || st.Canceled != 2 || st.Waiting != 0 {
		t.Errorf("Stats %+v, want 1 granted, 1 refused, 2 canceled, 0 waiting", st)
	}
	if st := b.Stats(); st.Granted != 6 || st.Waiting != 0 {
		t.Errorf("Stats %+v, want 6 granted", st)
	}
	for _, e := range rec.events {
		if e.Limiter != "bucket" || !strings.HasPrefix(e.Name, t.Name()) {
			t.Fatalf("event %+v: wrong limiter or name", e)
		}
	}
}

// TestObserverLane: each event carries its caller's lane: the name given
// to WithLane, "" for the default lane and for a name the bucket refuses.
func TestObserverLane(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	rec := &recorder{}
	b := newBucket(t, rdb, bucket.Config{Capacity: 10, RefillAmount: 1, RefillFrequency: time.Second, Observer: rec})
	ctx := withTimeout(t, 10*time.Second)
	for _, name := range []string{"tenant-1", "", "tenant-2"} {
		lctx := ctx
		if name != "" {
			lctx = bucket.WithLane(ctx, name)
		}
		if err := b.Enter(lctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Enter(bucket.WithLane(ctx, "a b")); !errors.Is(err, sluice.ErrConfig) {
		t.Fatalf("Enter in lane \"a b\" = %v, want sluice.ErrConfig", err)
	}
	var got []string
	for _, e := range rec.all() {
		got = append(got, e.Result.String()+":"+e.Lane)
	}
	if want := []string{"granted:tenant-1", "granted:", "granted:tenant-2", "failed:"}; !slices.Equal(got, want) {
		t.Errorf("events' results and lanes %q, want %q", got, want)
	}
}

// TestInspect: what every process sees, in one round trip: during a
// saturated run the queue, the scheduler's process (this one) and a wait;
// once idle, an empty queue and full policies.
func TestInspect(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	cfg := bucket.Config{Name: t.Name(), Capacity: 3, RefillAmount: 1, RefillFrequency: 10 * time.Millisecond}
	b := newBucket(t, rdb, cfg)
	ctx := withTimeout(t, 20*time.Second)
	run, stop := context.WithTimeout(ctx, 800*time.Millisecond)
	defer stop()
	var saw bucket.Inspection
	var mu sync.Mutex
	go func() {
		for run.Err() == nil {
			in, err := b.Inspect(ctx)
			if err == nil && in.Queued > 0 && in.Scheduler != "" {
				mu.Lock()
				saw = in
				mu.Unlock()
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	saturate(run, b, 15)
	mu.Lock()
	in := saw
	mu.Unlock()
	if in.Queued == 0 {
		t.Fatal("no inspection saw callers queued")
	}
	host, _ := os.Hostname()
	if want := host + ":" + strconv.Itoa(os.Getpid()); in.Scheduler != want {
		t.Errorf("scheduler %q, want this process %q", in.Scheduler, want)
	}
	if in.SchedulerTTL <= 0 || in.Wait <= 0 || len(in.Levels) != 1 || in.Levels[0].Tokens > 0 || !in.Stored || in.Format != 2 {
		t.Errorf("inspection under load %+v", in)
	}
	var last bucket.Inspection
	var lastErr error
	defer func() {
		if t.Failed() {
			t.Logf("last inspection: %+v, err %v", last, lastErr)
		}
	}()
	waitFor(t, 15*time.Second, "the bucket to go idle and full", func() bool {
		last, lastErr = b.Inspect(ctx)
		return lastErr == nil && last.Queued == 0 && last.Levels[0].Tokens == 3 && last.Wait == 0 && last.Scheduler == ""
	})
}

// TestLogger: a process that follows a live change says so, and one that
// refuses the policies in force says why; without a Logger, nothing.
func TestLogger(t *testing.T) {
	srv := redistest.New(t)
	rdb := srv.Client()
	defer rdb.Close()
	var buf bytes.Buffer
	var mu sync.Mutex
	logger := slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return buf.Write(p)
	}), nil))
	cfg := bucket.Config{Name: t.Name(), Capacity: 3, RefillAmount: 1, RefillFrequency: 10 * time.Millisecond}
	admin := newBucket(t, rdb, cfg)
	logged := cfg
	logged.Logger = logger
	b := newBucket(t, rdb, logged)
	ctx := withTimeout(t, 10*time.Second)
	if err := b.Enter(ctx); err != nil {
		t.Fatal(err)
	}
	if err := admin.SetPolicies(ctx, bucket.AsIs, bucket.Policy{Capacity: 5, RefillAmount: 1, RefillFrequency: 5 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	if err := b.Enter(ctx); err != nil {
		t.Fatal(err)
	}
	other := cfg
	other.Capacity, other.Logger = 7, logger
	if err := newBucket(t, rdb, other).Enter(ctx); !errors.Is(err, sluice.ErrConfigMismatch) {
		t.Fatalf("Enter with other policies = %v", err)
	}
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	for _, want := range []string{"following the policies in force", "differ from the ones in force"} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
