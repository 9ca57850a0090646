package local

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

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

func (r *recorder) all() []sluice.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]sluice.Event(nil), r.events...)
}

// want is an Event a test expects, its Wait rounded to the microsecond
// (Rate's rounding guard adds nanoseconds to each interval).
type want struct {
	res    sluice.Result
	why    string
	queued bool
	wait   time.Duration
}

// checkEvents compares the events, in any order, to the ones wanted, all
// of limiter kind and on time (Late 0: under synctest timers fire on
// time).
func checkEvents(t *testing.T, kind string, got []sluice.Event, wants []want) {
	t.Helper()
	left := append([]want(nil), wants...)
	for _, e := range got {
		w := want{e.Result, e.Reason, e.Queued, e.Wait.Round(time.Microsecond)}
		found := false
		for i, l := range left {
			if l == w {
				left = append(left[:i], left[i+1:]...)
				found = true
				break
			}
		}
		if !found {
			t.Errorf("unexpected event %+v", e)
		}
		if e.Limiter != kind || e.Name != "" || e.Late != 0 || e.Reentries != 0 {
			t.Errorf("event %+v: want Limiter %q, no Name, Late or Reentries", e, kind)
		}
	}
	for _, l := range left {
		t.Errorf("no event %+v", l)
	}
}

// run calls enter in a goroutine and returns its error's channel, once
// the call is blocked or done.
func run(enter func() error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- enter() }()
	synctest.Wait()
	return ch
}

// TestRateObserver: each call reported once, with its wait on the fake
// clock: a grant at once, two queued ones at their slots, a full queue, a
// cost above Burst, a caller that gives up in the queue, and Do; Stats
// counts the same, and Waiting while they wait. A negative cost is a bug,
// not a call: not reported.
func TestRateObserver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		r, err := NewRate(RateConfig{Rate: 10, MaxQueue: 2, Observer: rec})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if err := r.Enter(ctx); err != nil {
			t.Fatal(err)
		}
		a := run(func() error { return r.Enter(ctx) })
		b := run(func() error { return r.EnterN(ctx, 1) })
		if st := r.Stats(); st.Waiting != 2 || st.Granted != 1 {
			t.Errorf("Stats with two waiting: %+v", st)
		}
		if err := r.Enter(ctx); !errors.Is(err, sluice.ErrQueueFull) {
			t.Errorf("Enter with the queue full = %v", err)
		}
		if err := r.EnterN(ctx, 2); !errors.Is(err, sluice.ErrCostExceedsCapacity) {
			t.Errorf("EnterN(2) of Burst 1 = %v", err)
		}
		if err := r.EnterN(ctx, -1); err == nil {
			t.Error("EnterN(-1) succeeded")
		}
		for _, ch := range []<-chan error{a, b} {
			if err := <-ch; err != nil {
				t.Error(err)
			}
		}
		// At 200 ms: the next slot is at 300 ms; this caller gives up at 250.
		gone, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		if err := r.Enter(gone); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Enter given up = %v", err)
		}
		if err := r.Do(ctx, func(context.Context) error { return nil }); err != nil {
			t.Error(err)
		}
		if st, w := r.Stats(), (sluice.Stats{Granted: 4, Refused: 2, Canceled: 1}); st != w {
			t.Errorf("Stats %+v, want %+v", st, w)
		}
		checkEvents(t, "local.rate", rec.all(), []want{
			{sluice.Granted, "", false, 0},
			{sluice.Granted, "", true, 100 * time.Millisecond},
			{sluice.Granted, "", true, 200 * time.Millisecond},
			{sluice.Refused, "queue_full", false, 0},
			{sluice.Refused, "cost_exceeds_capacity", false, 0},
			{sluice.Canceled, "", true, 50 * time.Millisecond},
			// Do at 250 ms: its slot, given back by the caller that gave
			// up, is at 300.
			{sluice.Granted, "", true, 50 * time.Millisecond},
		})

		rec.events = nil
		r, _ = NewRate(RateConfig{Rate: 10, MaxWait: 250 * time.Millisecond, Observer: rec})
		r.Enter(ctx)
		c := run(func() error { return r.Enter(ctx) })
		d := run(func() error { return r.Enter(ctx) })
		if err := r.Enter(ctx); !errors.Is(err, sluice.ErrWaitTooLong) {
			t.Errorf("Enter 300 ms away = %v", err)
		}
		<-c
		<-d
		checkEvents(t, "local.rate", rec.all(), []want{
			{sluice.Granted, "", false, 0},
			{sluice.Granted, "", true, 100 * time.Millisecond},
			{sluice.Granted, "", true, 200 * time.Millisecond},
			{sluice.Refused, "wait_too_long", false, 0},
		})
	})
}

// TestSpacerObserver: starts Space apart, each one's wait reported.
func TestSpacerObserver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		s, err := NewSpacer(SpacerConfig{Space: 100 * time.Millisecond, Observer: rec})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		var chs []<-chan error
		for range 3 {
			chs = append(chs, run(func() error { return s.Enter(ctx) }))
		}
		if st := s.Stats(); st.Waiting != 2 || st.Granted != 1 {
			t.Errorf("Stats with two waiting: %+v", st)
		}
		for _, ch := range chs {
			if err := <-ch; err != nil {
				t.Error(err)
			}
		}
		if st, w := s.Stats(), (sluice.Stats{Granted: 3}); st != w {
			t.Errorf("Stats %+v, want %+v", st, w)
		}
		checkEvents(t, "local.spacer", rec.all(), []want{
			{sluice.Granted, "", false, 0},
			{sluice.Granted, "", true, 100 * time.Millisecond},
			{sluice.Granted, "", true, 200 * time.Millisecond},
		})
	})
}

// TestConcurrencyObserver: grants at once and after a release, an
// AcquireTimeout, a cost above Limit, a caller that gives up, Do's
// RunTimeout; Held follows the slots held.
func TestConcurrencyObserver(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rec := &recorder{}
		c, err := NewConcurrency(ConcurrencyConfig{Limit: 3, AcquireTimeout: 100 * time.Millisecond, Observer: rec})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		if err := c.Acquire(ctx); err != nil {
			t.Fatal(err)
		}
		if err := c.AcquireN(ctx, 2); err != nil {
			t.Fatal(err)
		}
		if st := c.Stats(); st.Held != 3 || st.Granted != 2 {
			t.Errorf("Stats with 3 held: %+v", st)
		}
		if err := c.Acquire(ctx); !errors.Is(err, ErrTimeout) {
			t.Errorf("Acquire past AcquireTimeout = %v", err)
		}
		if err := c.AcquireN(ctx, 4); !errors.Is(err, sluice.ErrCostExceedsCapacity) {
			t.Errorf("AcquireN(4) of Limit 3 = %v", err)
		}
		gone, cancel := context.WithCancel(ctx)
		g := run(func() error { return c.AcquireN(gone, 2) })
		cancel()
		if err := <-g; !errors.Is(err, context.Canceled) {
			t.Errorf("AcquireN given up = %v", err)
		}
		w := run(func() error { return c.Acquire(ctx) })
		if st := c.Stats(); st.Waiting != 1 {
			t.Errorf("Stats with one waiting: %+v", st)
		}
		time.Sleep(30 * time.Millisecond)
		c.Release()
		if err := <-w; err != nil {
			t.Error(err)
		}
		c.ReleaseN(2)
		if st := c.Stats(); st.Held != 1 {
			t.Errorf("Stats with 1 held: %+v", st)
		}
		if err := c.Do(ctx, func(context.Context) error {
			if st := c.Stats(); st.Held != 2 {
				t.Errorf("Stats inside Do: %+v", st)
			}
			return nil
		}); err != nil {
			t.Error(err)
		}
		c.Release()
		if st, w := c.Stats(), (sluice.Stats{Granted: 4, Refused: 2, Canceled: 1}); st != w {
			t.Errorf("Stats %+v, want %+v", st, w)
		}
		checkEvents(t, "local.concurrency", rec.all(), []want{
			{sluice.Granted, "", false, 0},
			{sluice.Granted, "", false, 0},
			{sluice.Refused, "timeout", true, 100 * time.Millisecond},
			{sluice.Refused, "cost_exceeds_capacity", false, 0},
			{sluice.Canceled, "", true, 0},
			{sluice.Granted, "", true, 30 * time.Millisecond},
			{sluice.Granted, "", false, 0},
		})

		// Do's RunTimeout ends the wait: a refusal, "timeout".
		rec.events = nil
		d, _ := NewConcurrency(ConcurrencyConfig{Limit: 1, RunTimeout: 40 * time.Millisecond, Observer: rec})
		d.Acquire(ctx)
		if err := d.Do(ctx, func(context.Context) error { return nil }); !errors.Is(err, ErrTimeout) {
			t.Errorf("Do past RunTimeout = %v", err)
		}
		checkEvents(t, "local.concurrency", rec.all(), []want{
			{sluice.Granted, "", false, 0},
			{sluice.Refused, "timeout", true, 40 * time.Millisecond},
		})
		if st := d.Stats(); st.Held != 1 || st.Refused != 1 {
			t.Errorf("Stats %+v", st)
		}
	})
}

// TestNoopStats: a Noop counts nothing.
func TestNoopStats(t *testing.T) {
	var lim sluice.StatsReader = Noop{}
	Noop{}.Enter(context.Background())
	if st := lim.Stats(); st != (sluice.Stats{}) {
		t.Errorf("Noop Stats %+v", st)
	}
}
