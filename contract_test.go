package sluice_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/internal/testing/testkit"
	"github.com/sluicehq/sluice/local"
	"github.com/sluicehq/sluice/semaphore"
)

// The contract every sluice.Limiter keeps, checked on each implementation
// alike, as uber-go/ratelimit runs one test over all of its limiters. A
// limiter that lacks a feature (a refusal, a cost) skips that case, saying
// why for its own type; everything else it must pass as the others do.
//
// Each case makes its own limiter with room for exactly one caller: a
// capacity (burst) of 1 for the rate limiters, one permit for the
// concurrency limiters. That makes "took nothing" and "gave its place back"
// visible: a place lost would make the next caller wait an hour, or for
// ever, and so miss a deadline of a few seconds.

// hour is a refill too slow to reach within a test: a rate limiter with it
// has one start to give, and a second caller waits.
const hour = time.Hour

// within bounds every wait for something that should happen at once or at
// a known time: ample on a loaded machine, far shorter than the hour a lost
// place would cost.
const within = 10 * time.Second

// shape is what a case asks of a new limiter.
type shape struct {
	observer sluice.Observer
	// period: a rate limiter gives one start per period (capacity 1).
	period time.Duration
	// refuse: configure the limiter's refusal (MaxQueue 1, or an acquire
	// timeout where it has no queue bound).
	refuse bool
}

// subject is one sluice.Limiter implementation and how to drive what is
// particular to it.
type subject struct {
	name string
	// kind is its Event.Limiter.
	kind string
	// holds: a concurrency limiter, whose caller holds its place while fn
	// runs. Otherwise a rate limiter, which lets one caller start per
	// period and holds nothing.
	holds bool
	// make returns a limiter of the shape, closed at t's cleanup, and the
	// name its Events carry.
	make func(t *testing.T, s shape) (sluice.Limiter, string)
	// waiting counts the callers waiting for l, as its authority sees them
	// (Redis for the distributed limiters), to know a caller has queued.
	waiting func(ctx context.Context, l sluice.Limiter) (int, error)
	// refusesQueued: its refusal needs a caller already waiting (MaxQueue);
	// otherwise it refuses a caller that waits too long.
	refusesQueued bool
	// takeN takes a cost of n (the limiter's EnterN or AcquireN) and
	// returns what gives it back.
	takeN func(ctx context.Context, l sluice.Limiter, n int) (release func(), err error)

	// Why a case does not apply to this type; "" where it does.
	neverWaits, noRefusal, noCost, noObserver string

	// placeBackLeftOut names a known failure of the check that a caller
	// after one who gave up gets its place; "" where the check runs.
	placeBackLeftOut string
}

func TestContract(t *testing.T) {
	// Runs last, after every limiter, client and server is closed.
	before := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, before) })
	srv := redistest.New(t)
	rdb := srv.Client()
	t.Cleanup(func() { rdb.Close() })

	for _, s := range subjects(rdb) {
		t.Run(s.name, func(t *testing.T) {
			t.Parallel()
			t.Run("ReturnsFnError", s.testReturnsFnError)
			t.Run("PanicReleases", s.testPanicReleases)
			t.Run("CanceledBeforeEntry", s.testCanceledBeforeEntry)
			t.Run("CanceledWhileWaiting", s.testCanceledWhileWaiting)
			t.Run("Refusal", s.testRefusal)
			t.Run("CostAboveCapacity", s.testCostAboveCapacity)
		})
	}
}

func subjects(rdb redis.UniversalClient) []subject {
	return []subject{
		{
			name: "bucket", kind: "bucket",
			make: func(t *testing.T, s shape) (sluice.Limiter, string) {
				cfg := bucket.Config{
					Name:            uniqueName(t),
					Capacity:        1,
					RefillAmount:    1,
					RefillFrequency: s.period,
					Observer:        s.observer,
					// Never enter again when late: a process starved on a
					// loaded machine would otherwise spend its token by
					// design and wait a period more, which is not what
					// these cases judge.
					MaxLateness: -1,
				}
				if s.refuse {
					cfg.MaxQueue = 1
				}
				b, err := bucket.New(rdb, cfg)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { b.Close() })
				return b, cfg.Name
			},
			waiting: func(ctx context.Context, l sluice.Limiter) (int, error) {
				in, err := l.(*bucket.Bucket).Inspect(ctx)
				return in.Queued, err
			},
			refusesQueued: true,
			takeN: func(ctx context.Context, l sluice.Limiter, n int) (func(), error) {
				return func() {}, l.(*bucket.Bucket).EnterN(ctx, n)
			},
		},
		{
			name: "semaphore", kind: "semaphore", holds: true,
			make: func(t *testing.T, s shape) (sluice.Limiter, string) {
				cfg := semaphore.Config{
					Name:     uniqueName(t),
					Capacity: 1,
					// Far longer than any wait here: a place that is not
					// given back cannot come back by expiring in time.
					LeaseTTL: time.Minute,
					QueueTTL: time.Minute,
					Observer: s.observer,
				}
				if s.refuse {
					cfg.MaxQueue = 1
				}
				sem, err := semaphore.New(rdb, cfg)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { sem.Close() })
				return sem, cfg.Name
			},
			waiting: func(ctx context.Context, l sluice.Limiter) (int, error) {
				in, err := l.(*semaphore.Semaphore).Inspect(ctx)
				return in.Queued, err
			},
			refusesQueued: true,
			takeN: func(ctx context.Context, l sluice.Limiter, n int) (func(), error) {
				p, err := l.(*semaphore.Semaphore).AcquireN(ctx, n)
				if err != nil {
					return nil, err
				}
				return func() { p.Release(context.Background()) }, nil
			},
		},
		{
			name: "local.Rate", kind: "local.rate",
			make: func(t *testing.T, s shape) (sluice.Limiter, string) {
				cfg := local.RateConfig{Rate: 1, Period: s.period, Burst: 1, Observer: s.observer}
				if s.refuse {
					cfg.MaxQueue = 1
				}
				r, err := local.NewRate(cfg)
				if err != nil {
					t.Fatal(err)
				}
				return r, ""
			},
			waiting: func(_ context.Context, l sluice.Limiter) (int, error) {
				return l.(*local.Rate).Waiting(), nil
			},
			refusesQueued: true,
			takeN: func(ctx context.Context, l sluice.Limiter, n int) (func(), error) {
				return func() {}, l.(*local.Rate).EnterN(ctx, n)
			},
		},
		{
			name: "local.Concurrency", kind: "local.concurrency", holds: true,
			make: func(t *testing.T, s shape) (sluice.Limiter, string) {
				cfg := local.ConcurrencyConfig{Limit: 1, Observer: s.observer}
				if s.refuse {
					// No queue bound: it refuses a caller that waited this
					// long.
					cfg.AcquireTimeout = 100 * time.Millisecond
				}
				c, err := local.NewConcurrency(cfg)
				if err != nil {
					t.Fatal(err)
				}
				return c, ""
			},
			// Its count of waiters starts before the caller has queued in
			// the semaphore; a cancel that lands in between is still a
			// caller giving up.
			waiting: func(_ context.Context, l sluice.Limiter) (int, error) {
				return int(l.(*local.Concurrency).Stats().Waiting), nil
			},
			takeN: func(ctx context.Context, l sluice.Limiter, n int) (func(), error) {
				c := l.(*local.Concurrency)
				if err := c.AcquireN(ctx, n); err != nil {
					return nil, err
				}
				return func() { c.ReleaseN(n) }, nil
			},
		},
		{
			name: "local.Spacer", kind: "local.spacer",
			make: func(t *testing.T, s shape) (sluice.Limiter, string) {
				sp, err := local.NewSpacer(local.SpacerConfig{Space: s.period, Observer: s.observer})
				if err != nil {
					t.Fatal(err)
				}
				return sp, ""
			},
			waiting: func(_ context.Context, l sluice.Limiter) (int, error) {
				return l.(*local.Spacer).Waiting(), nil
			},
			noRefusal: "local.Spacer has neither MaxQueue nor MaxWait: it never refuses a caller",
			noCost:    "local.Spacer takes no cost: every start costs 1 (it has no EnterN)",
		},
		{
			name: "local.Noop", kind: "",
			make: func(*testing.T, shape) (sluice.Limiter, string) {
				return local.Noop{}, ""
			},
			neverWaits: "local.Noop never waits, so no caller can give up while waiting",
			noRefusal:  "local.Noop never refuses a caller",
			noCost:     "local.Noop has no capacity: EnterN and AcquireN take any cost",
			noObserver: "local.Noop has no Observer: it reports no Event",
		},
	}
}

// uniqueName is a Redis name for t alone, also across runs (-count) on one
// server.
func uniqueName(t *testing.T) string {
	return t.Name() + "-" + strconv.FormatInt(time.Now().UnixNano(), 36)
}

// marker is the ctx key by which fn recognises the caller's ctx.
type marker struct{}

// testReturnsFnError: Do runs fn once, with the caller's ctx (or one made
// from it), and returns fn's error; nil when fn returns nil.
func (s subject) testReturnsFnError(t *testing.T) {
	t.Parallel()
	events := s.recorder(t)
	l, name := s.make(t, shape{observer: events.observer(), period: 20 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.WithValue(t.Context(), marker{}, t.Name()), within)
	defer cancel()

	want := errors.New("fn's own error")
	runs := 0
	err := l.Do(ctx, func(ctx context.Context) error {
		runs++
		if got := ctx.Value(marker{}); got != t.Name() {
			t.Errorf("fn's ctx does not come from Do's: value %v, want %q", got, t.Name())
		}
		return want
	})
	if !errors.Is(err, want) {
		t.Errorf("Do = %v, want fn's error %v", err, want)
	}
	if runs != 1 {
		t.Errorf("fn ran %d times, want 1", runs)
	}
	events.expect(t, name, sluice.Granted)

	runs = 0
	if err := l.Do(ctx, func(context.Context) error { runs++; return nil }); err != nil {
		t.Errorf("Do with fn returning nil = %v, want nil", err)
	}
	if runs != 1 {
		t.Errorf("fn ran %d times, want 1", runs)
	}
	events.expect(t, name, sluice.Granted)
}

// testPanicReleases: a panic in fn reaches Do's caller unchanged, and the
// limiter is left as if fn had returned: a concurrency limiter has its
// one place back (a caller after gets it at once, where a place kept would
// block it for good), a rate limiter lets the next caller start in its
// turn.
func (s subject) testPanicReleases(t *testing.T) {
	t.Parallel()
	events := s.recorder(t)
	l, name := s.make(t, shape{observer: events.observer(), period: 100 * time.Millisecond})
	ctx, cancel := context.WithTimeout(t.Context(), within)
	defer cancel()

	value := &struct{ what string }{"fn's panic"}
	got := func() (r any) {
		defer func() { r = recover() }()
		l.Do(ctx, func(context.Context) error { panic(value) })
		return nil
	}()
	if got != value {
		t.Fatalf("Do's caller recovered %v, want fn's panic value %v", got, value)
	}
	events.expect(t, name, sluice.Granted)

	if err := l.Do(ctx, func(context.Context) error { return nil }); err != nil {
		t.Fatalf("Do after fn panicked = %v, want nil (the place was not given back)", err)
	}
	events.expect(t, name, sluice.Granted)
	if s.holds {
		s.waitHeld(t, l, 0)
	}
}

// testCanceledBeforeEntry: a ctx already ended makes Do return an error
// matching ctx.Err() without running fn, and take nothing: the one place
// is still there for the next caller.
func (s subject) testCanceledBeforeEntry(t *testing.T) {
	t.Parallel()
	events := s.recorder(t)
	l, name := s.make(t, shape{observer: events.observer(), period: hour})

	ended, cancel := context.WithDeadline(t.Context(), time.Now().Add(-time.Second))
	defer cancel()
	err := l.Do(ended, func(context.Context) error {
		t.Error("fn ran with a ctx that had ended")
		return nil
	})
	if err == nil || !errors.Is(err, ended.Err()) {
		t.Errorf("Do with an ended ctx = %v, want an error matching %v", err, ended.Err())
	}
	events.expect(t, name, sluice.Canceled)

	ctx, cancel := context.WithTimeout(t.Context(), within)
	defer cancel()
	if err := l.Do(ctx, func(context.Context) error { return nil }); err != nil {
		t.Errorf("Do after a canceled caller = %v, want nil at once (the canceled caller took the place)", err)
	}
	events.expect(t, name, sluice.Granted)
}

// testCanceledWhileWaiting: a caller whose ctx ends while it waits gets an
// error matching ctx.Err(), fn does not run, and its place goes to the
// next caller: a rate limiter's next start goes to the caller after it,
// in the turn it would have had, and a concurrency limiter's permit, once
// freed, to the caller after it.
func (s subject) testCanceledWhileWaiting(t *testing.T) {
	if s.neverWaits != "" {
		t.Skip(s.neverWaits)
	}
	t.Parallel()
	events := s.recorder(t)
	// A rate limiter's turn comes each period: long enough that the
	// caller surely gives up before its turn, short enough to wait for.
	const period = 2 * time.Second
	l, name := s.make(t, shape{observer: events.observer(), period: period})
	ctx, cancel := context.WithTimeout(t.Context(), within)
	defer cancel()

	// Take the one place: the first start, or the permit held by fn.
	start := time.Now()
	hold := s.occupy(t, ctx, l)
	events.expect(t, name, sluice.Granted)

	waiter, giveUp := context.WithCancel(ctx)
	done := doAsync(waiter, l)
	s.waitWaiting(t, ctx, l, 1)
	giveUp()
	res := await(t, done)
	if !errors.Is(res.err, context.Canceled) {
		t.Fatalf("Do of a caller that gave up = %v, want an error matching %v", res.err, context.Canceled)
	}
	if res.ran {
		t.Error("fn ran for a caller that gave up")
	}
	events.expect(t, name, sluice.Canceled)
	if !s.holds && time.Since(start) > period/2 {
		t.Fatalf("the caller gave up %v after the first start, too near its turn at %v to judge", time.Since(start), period)
	}

	hold()
	if s.holds {
		events.expect(t, name) // the holder's release is no Event
	}
	if s.placeBackLeftOut != "" {
		t.Logf("not checked that the place is given back: %s", s.placeBackLeftOut)
		return
	}
	err := l.Do(ctx, func(context.Context) error { return nil })
	if err != nil {
		t.Fatalf("Do after a caller gave up = %v, want nil (its place was not given back)", err)
	}
	events.expect(t, name, sluice.Granted)
	if !s.holds {
		// The caller who gave up had the second turn; the next one must
		// get it, not the third.
		if took := time.Since(start); took > period+period/2 {
			t.Errorf("the caller after one who gave up started %v after the first, want its turn at %v: the one who gave up consumed it", took, period)
		}
	} else {
		s.waitHeld(t, l, 0)
	}
}

// testRefusal: a limiter's refusal (MaxQueue, or an acquire timeout)
// matches sluice.ErrLimited, before the caller's ctx ends, and fn does not
// run.
func (s subject) testRefusal(t *testing.T) {
	if s.noRefusal != "" {
		t.Skip(s.noRefusal)
	}
	t.Parallel()
	events := s.recorder(t)
	l, name := s.make(t, shape{observer: events.observer(), period: hour, refuse: true})
	ctx, cancel := context.WithTimeout(t.Context(), within)
	defer cancel()

	hold := s.occupy(t, ctx, l)
	defer hold()
	events.expect(t, name, sluice.Granted)
	if s.refusesQueued {
		// Fill the queue: MaxQueue is 1. The waiter has no deadline: one
		// that its turn, an hour off, passes would be refused at once.
		waiter, giveUp := context.WithCancel(t.Context())
		done := doAsync(waiter, l)
		s.waitWaiting(t, ctx, l, 1)
		defer func() {
			giveUp()
			await(t, done)
			events.expect(t, name, sluice.Canceled)
		}()
	}

	err := l.Do(ctx, func(context.Context) error {
		t.Error("fn ran for a refused caller")
		return nil
	})
	if !errors.Is(err, sluice.ErrLimited) {
		t.Fatalf("Do of a caller to refuse = %v, want an error matching sluice.ErrLimited", err)
	}
	if ctx.Err() != nil {
		t.Errorf("refused only when its ctx had ended (%v)", ctx.Err())
	}
	events.expect(t, name, sluice.Refused)
}

// testCostAboveCapacity: a cost no wait could grant is refused at once
// with an error matching sluice.ErrCostExceedsCapacity and not
// sluice.ErrLimited, and takes nothing: the one place is there for a cost
// of 1 after it.
func (s subject) testCostAboveCapacity(t *testing.T) {
	if s.noCost != "" {
		t.Skip(s.noCost)
	}
	t.Parallel()
	events := s.recorder(t)
	l, name := s.make(t, shape{observer: events.observer(), period: hour})
	ctx, cancel := context.WithTimeout(t.Context(), within)
	defer cancel()

	release, err := s.takeN(ctx, l, 2)
	if err == nil {
		release()
		t.Fatal("a cost of 2 with a capacity of 1 was granted")
	}
	if !errors.Is(err, sluice.ErrCostExceedsCapacity) || errors.Is(err, sluice.ErrLimited) {
		t.Errorf("cost 2 of capacity 1 = %v, want an error matching sluice.ErrCostExceedsCapacity and not sluice.ErrLimited", err)
	}
	if ctx.Err() != nil {
		t.Errorf("refused only when its ctx had ended (%v), not at once", ctx.Err())
	}
	events.expect(t, name, sluice.Refused)
	events.expectReason(t, "cost_exceeds_capacity")

	release, err = s.takeN(ctx, l, 1)
	if err != nil {
		t.Fatalf("cost 1 after a refused cost = %v, want nil (the refused cost took the place)", err)
	}
	release()
	events.expect(t, name, sluice.Granted)
}

// occupy takes the limiter's one place and returns what gives it back: for
// a rate limiter the first start (nothing to give back: its next comes
// with the refill), for a concurrency limiter a Do whose fn runs until
// the returned func is called.
func (s subject) occupy(t *testing.T, ctx context.Context, l sluice.Limiter) (release func()) {
	t.Helper()
	if !s.holds {
		if err := l.Do(ctx, func(context.Context) error { return nil }); err != nil {
			t.Fatalf("first Do = %v", err)
		}
		return func() {}
	}
	inside, leave := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- l.Do(ctx, func(context.Context) error {
			close(inside)
			<-leave
			return nil
		})
	}()
	select {
	case <-inside:
	case err := <-done:
		t.Fatalf("the holder's Do = %v before its fn ran", err)
	case <-time.After(within):
		t.Fatalf("the holder's fn did not run within %v", within)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			close(leave)
			select {
			case err := <-done:
				if err != nil {
					t.Errorf("the holder's Do = %v, want nil", err)
				}
			case <-time.After(within):
				t.Errorf("the holder's Do did not return within %v of its fn", within)
			}
		})
	}
}

// result is what a Do in another goroutine returned.
type result struct {
	err error
	ran bool
}

// doAsync runs a Do of l with ctx in a goroutine and sends what it
// returned.
func doAsync(ctx context.Context, l sluice.Limiter) <-chan result {
	done := make(chan result, 1)
	go func() {
		var r result
		r.err = l.Do(ctx, func(context.Context) error { r.ran = true; return nil })
		done <- r
	}()
	return done
}

func await(t *testing.T, done <-chan result) result {
	t.Helper()
	select {
	case r := <-done:
		return r
	case <-time.After(within):
		t.Fatalf("Do did not return within %v", within)
		return result{}
	}
}

// waitWaiting waits until n callers wait for l.
func (s subject) waitWaiting(t *testing.T, ctx context.Context, l sluice.Limiter, n int) {
	t.Helper()
	var got int
	waitFor(t, fmt.Sprintf("%d callers waiting", n), func() bool {
		var err error
		got, err = s.waiting(ctx, l)
		if err != nil {
			t.Fatalf("counting the callers waiting: %v", err)
		}
		return got == n
	})
}

// waitHeld waits until this process holds n of a concurrency limiter's
// places: Release may return before the place is back (the semaphore
// sends it in the background).
func (s subject) waitHeld(t *testing.T, l sluice.Limiter, n int64) {
	t.Helper()
	waitFor(t, fmt.Sprintf("%d held", n), func() bool {
		return l.(sluice.StatsReader).Stats().Held == n
	})
}

// waitFor polls cond until it holds, failing t after within.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	testkit.WaitFor(t, within, what, cond)
}

// events records a limiter's Events, so that a case can check that each
// call it made was reported once, with its outcome.
type events struct {
	kind string // the Limiter the Events must name
	mu   sync.Mutex
	got  []sluice.Event
	seen int // got[:seen] are checked
}

// recorder returns an Observer for s, or nil (logging why) when s has none.
func (s subject) recorder(t *testing.T) *events {
	if s.noObserver != "" {
		t.Logf("Events not checked: %s", s.noObserver)
		return nil
	}
	return &events{kind: s.kind}
}

func (e *events) Observe(ev sluice.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.got = append(e.got, ev)
}

// observer is e as a sluice.Observer: nil (not a nil *events) when e is.
func (e *events) observer() sluice.Observer {
	if e == nil {
		return nil
	}
	return e
}

// expect checks that the calls returned since the last check were reported
// once each: one Event per wanted result, in any order (the calls may be
// on several goroutines), each naming the limiter.
func (e *events) expect(t *testing.T, name string, want ...sluice.Result) {
	t.Helper()
	if e == nil {
		return
	}
	e.mu.Lock()
	fresh := append([]sluice.Event(nil), e.got[e.seen:]...)
	e.seen = len(e.got)
	e.mu.Unlock()

	count := map[sluice.Result]int{}
	for _, ev := range fresh {
		count[ev.Result]++
		if ev.Limiter != e.kind || ev.Name != name {
			t.Errorf("Event names limiter %q %q, want %q %q", ev.Limiter, ev.Name, e.kind, name)
		}
	}
	for _, r := range want {
		count[r]--
	}
	for r, n := range count {
		if n != 0 {
			t.Errorf("Events since the last check: %v, want one for each of %v (%v off by %+d)", fresh, want, r, n)
			return
		}
	}
}

// expectReason checks the Reason of the last Event.
func (e *events) expectReason(t *testing.T, reason string) {
	t.Helper()
	if e == nil {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.got) == 0 || e.got[len(e.got)-1].Reason != reason {
		t.Errorf("Events %v: want the last to have Reason %q", e.got, reason)
	}
}
