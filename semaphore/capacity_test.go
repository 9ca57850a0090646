package semaphore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
)

// TestCapacityMismatch: two processes configured with different
// capacities, in both orders of arrival. The first stores its own; the
// second gets a *sluice.ConfigMismatchError naming both (read with
// errors.As), writes nothing, and never takes the holders above the
// capacity in force while the first runs saturated.
func TestCapacityMismatch(t *testing.T) {
	for _, tc := range []struct{ first, second int }{{2, 3}, {3, 2}} {
		t.Run(fmt.Sprintf("%d then %d", tc.first, tc.second), func(t *testing.T) {
			e := newEnv(t)
			ctx := context.Background()
			name := t.Name()
			first := e.sem(t, Config{Name: name, Capacity: tc.first})
			second := e.sem(t, Config{Name: name, Capacity: tc.second})
			p := acquire(t, first, time.Second)
			leasesBefore := e.rdb.ZCard(ctx, first.keys[0]).Val()

			_, err := second.Acquire(ctx)
			switch {
			case !errors.Is(err, sluice.ErrConfigMismatch) || !errors.Is(err, sluice.ErrConfig):
				t.Fatalf("second process's Acquire: %v, want sluice.ErrConfigMismatch", err)
			case errors.Is(err, sluice.ErrLimited):
				t.Fatalf("%v matches ErrLimited", err)
			case !strings.Contains(err.Error(), fmt.Sprintf("this process has capacity %d", tc.second)) ||
				!strings.Contains(err.Error(), fmt.Sprintf("Redis has capacity %d", tc.first)):
				t.Fatalf("%v: does not name both capacities", err)
			}
			var mismatch *sluice.ConfigMismatchError
			if !errors.As(err, &mismatch) {
				t.Fatalf("second process's Acquire: %v (%T), want a *sluice.ConfigMismatchError", err, err)
			}
			mine, inForce := fmt.Sprintf("capacity %d", tc.second), fmt.Sprintf("capacity %d", tc.first)
			if mismatch.Limiter != "semaphore" || mismatch.Name != name || mismatch.Mine != mine || mismatch.InForce != inForce {
				t.Errorf("ConfigMismatchError = %+v, want semaphore %q, Mine %q, InForce %q", *mismatch, name, mine, inForce)
			}
			t.Log(err)
			if n := e.rdb.ZCard(ctx, first.keys[0]).Val(); n != leasesBefore {
				t.Fatalf("the refused arrival changed the leases: %d, were %d", n, leasesBefore)
			}
			if n, err := second.Capacity(ctx); err != nil || n != tc.first {
				t.Fatalf("second's Capacity: %d, %v; want %d", n, err, tc.first)
			}
			p.Release(ctx)

			// Saturated from the first process; the second keeps trying.
			ivs := saturateHandles(t, []*Semaphore{first, first}, 4, 400*time.Millisecond, 1, func() {
				c, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
				defer cancel()
				if q, err := second.AcquireN(c, 1); err == nil {
					q.Release(ctx)
					t.Error("the mismatched process was granted a permit")
				} else if !errors.Is(err, sluice.ErrConfigMismatch) {
					t.Errorf("mismatched Acquire: %v", err)
				}
			})
			peak, over := checkIntervals(ivs, tc.first, nil)
			t.Logf("%d intervals, peak %d of %d in force", len(ivs), peak, tc.first)
			if over > 0 {
				t.Fatalf("%d grants above the capacity in force %d", over, tc.first)
			}
			if peak != tc.first {
				t.Fatalf("peak %d: never saturated capacity %d", peak, tc.first)
			}

			// Not for ever: once the capacity in force is the second's, it
			// runs.
			if err := first.SetCapacity(ctx, tc.second); err != nil {
				t.Fatal(err)
			}
			acquire(t, second, time.Second).Release(ctx)
		})
	}
}

// TestAdopt: a process with Adopt set follows the capacity in force instead
// of failing, and stores its own when none is.
func TestAdopt(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	first := e.sem(t, Config{Name: t.Name(), Capacity: 3})
	p := acquire(t, first, time.Second)
	adopter := e.sem(t, Config{Name: t.Name(), Capacity: 1, Adopt: true})
	q1 := acquire(t, adopter, time.Second)
	q2 := acquire(t, adopter, time.Second) // two: it follows 3, not its own 1
	if n, err := adopter.Capacity(ctx); err != nil || n != 3 {
		t.Fatalf("Capacity: %d, %v; want 3", n, err)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := adopter.Acquire(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a fourth permit on capacity 3: %v", err)
	}
	for _, x := range []*Permit{p, q1, q2} {
		x.Release(ctx)
	}

	// Alone, an adopter stores its own capacity.
	alone := e.sem(t, Config{Name: t.Name() + "/alone", Capacity: 4, Adopt: true})
	acquire(t, alone, time.Second).Release(ctx)
	if got := e.rdb.HGet(ctx, alone.keys[4], fieldCapacity).Val(); got != "4" {
		t.Fatalf("stored capacity %q, want 4", got)
	}
}

// TestFollowLiveChange: a process that acquired under the capacity in force
// follows SetCapacity made elsewhere; a process started later with the old
// capacity is refused.
func TestFollowLiveChange(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	cfg := Config{Name: t.Name(), Capacity: 2}
	a := e.sem(t, cfg)
	acquire(t, a, time.Second).Release(ctx) // accepted under 2
	b := e.sem(t, cfg)
	if err := b.SetCapacity(ctx, 4); err != nil {
		t.Fatal(err)
	}
	if n, err := a.Capacity(ctx); err != nil || n != 4 {
		t.Fatalf("Capacity after SetCapacity: %d, %v", n, err)
	}
	var held []*Permit
	for range 3 {
		held = append(held, acquire(t, a, time.Second))
	}
	held = append(held, acquireN(t, a, 1, time.Second))
	if w := heldWeight(t, e.rdb, a); w != 4 {
		t.Fatalf("Redis counts %d held, want 4", w)
	}
	for _, p := range held {
		p.Release(ctx)
	}
	// Having followed 4, a takes a weight its own Config would refuse.
	acquireN(t, a, 3, time.Second).Release(ctx)
	late := e.sem(t, cfg)
	if _, err := late.Acquire(ctx); !errors.Is(err, sluice.ErrConfigMismatch) {
		t.Fatalf("a process started with the old capacity: %v, want sluice.ErrConfigMismatch", err)
	}
}

// TestSetCapacityRaiseWakes: raising the capacity grants the waiters it
// makes room for, in every process, at once: well before any of them would
// poll (their beat is 3 s).
func TestSetCapacityRaiseWakes(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	cfg := Config{Name: t.Name(), Capacity: 1, LeaseTTL: 9 * time.Second, QueueTTL: 9 * time.Second}
	x := e.sem(t, cfg)
	p := acquire(t, x, time.Second)
	procs := []*Semaphore{e.sem(t, cfg), e.sem(t, cfg), x}
	got := make(chan *Permit, 6)
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	for i := range 6 {
		s := procs[i%len(procs)]
		go func() {
			q, err := s.Acquire(wctx)
			if err != nil && !errors.Is(err, context.Canceled) {
				t.Error(err)
			}
			got <- q // nil for the waiter the cancel below ends
		}()
	}
	waitFor(t, 2*time.Second, "6 waiters", func() bool { return queueLen(t, e.rdb, x) == 6 })
	changed := time.Now()
	if err := x.SetCapacity(ctx, 5); err != nil {
		t.Fatal(err)
	}
	var permits []*Permit
	timeout := time.After(time.Second) // a third of the beat
	for range 4 {
		select {
		case q := <-got:
			permits = append(permits, q)
		case <-timeout:
			t.Fatalf("%d of 4 waiters granted within 1 s of the raise: they were not woken", len(permits))
		}
	}
	t.Logf("4 waiters granted %v after the raise began", time.Since(changed))
	if w, n := heldWeight(t, e.rdb, x), queueLen(t, e.rdb, x); w != 5 || n != 2 {
		t.Fatalf("Redis counts %d held and %d waiting, want 5 and 2", w, n)
	}
	select {
	case <-got:
		t.Fatal("a fifth waiter granted beyond capacity 5")
	default:
	}
	p.Release(ctx)
	if q := <-got; q == nil {
		t.Fatal("the release granted nobody")
	} else {
		permits = append(permits, q)
	}
	// The sixth waiter may be in any of the three processes (arrival order
	// between goroutines is the Go scheduler's): the cancel ends it.
	cancel()
	if q := <-got; q != nil {
		t.Fatal("a sixth waiter granted beyond capacity 5")
	}
	for _, q := range permits {
		q.Release(ctx)
	}
}

// TestSetCapacityLowerNoRevoke: lowering the capacity revokes nothing: the
// holders keep their permits (and renew them); nobody is admitted until the
// weight held falls below the new capacity.
func TestSetCapacityLowerNoRevoke(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	cfg := Config{Name: t.Name(), Capacity: 4, LeaseTTL: 600 * time.Millisecond, QueueTTL: 600 * time.Millisecond}
	a, b := e.sem(t, cfg), e.sem(t, cfg)
	var held []*Permit
	for range 4 {
		held = append(held, acquire(t, a, time.Second))
	}
	got := make(chan *Permit, 2)
	for i := range 2 {
		go func() {
			q, err := b.Acquire(ctx)
			if err != nil {
				t.Error(err)
			}
			got <- q
		}()
		waitFor(t, time.Second, "a waiter", func() bool { return queueLen(t, e.rdb, a) == int64(i+1) })
	}
	if err := b.SetCapacity(ctx, 2); err != nil {
		t.Fatal(err)
	}
	// Past a renewal: every holder renewed, none lost.
	first := held[0].validUntil()
	waitFor(t, 2*time.Second, "a renewal", func() bool { return held[0].validUntil().After(first) })
	for i, p := range held {
		select {
		case <-p.Lost():
			t.Fatalf("holder %d lost its permit to the lowering", i)
		default:
		}
	}
	check := func(when string, wantHeld, wantQueued int64) {
		t.Helper()
		if w, n := heldWeight(t, e.rdb, a), queueLen(t, e.rdb, a); w != wantHeld || n != wantQueued {
			t.Fatalf("%s: %d held, %d waiting; want %d and %d", when, w, n, wantHeld, wantQueued)
		}
	}
	check("after the lowering", 4, 2)
	releaseGone(t, e.rdb, held[0]) // 3 held, capacity 2: nobody in
	check("after one release", 3, 2)
	releaseGone(t, e.rdb, held[1]) // 2 held: still nobody
	check("after two releases", 2, 2)
	releaseGone(t, e.rdb, held[2]) // 1 held: one in
	check("after three releases", 2, 1)
	q := <-got
	releaseGone(t, e.rdb, held[3])
	check("after four releases", 2, 0)
	q2 := <-got
	q.Release(ctx)
	q2.Release(ctx)
}

// TestSetCapacityRefusesTooHeavy: waiters heavier than a lowered capacity
// leave the queue with sluice.ErrCostExceedsCapacity, in the process that lowered
// it and in another; a lighter waiter behind them moves up.
func TestSetCapacityRefusesTooHeavy(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	cfg := Config{Name: t.Name(), Capacity: 4, LeaseTTL: 9 * time.Second, QueueTTL: 9 * time.Second}
	a, b := e.sem(t, cfg), e.sem(t, cfg)
	holder := acquireN(t, a, 2, time.Second)
	type result struct {
		who string
		p   *Permit
		err error
	}
	results := make(chan result, 3)
	for i, w := range []struct {
		who string
		s   *Semaphore
		n   int
	}{{"heavy in the setter", a, 3}, {"heavy in another", b, 3}, {"light", b, 1}} {
		go func() {
			p, err := w.s.AcquireN(ctx, w.n)
			results <- result{w.who, p, err}
		}()
		waitFor(t, time.Second, w.who+" to queue", func() bool { return queueLen(t, e.rdb, a) == int64(i+1) })
	}
	if err := a.SetCapacity(ctx, 2); err != nil {
		t.Fatal(err)
	}
	timeout := time.After(time.Second) // a third of the beat: no poll
	for range 2 {
		select {
		case r := <-results:
			if !strings.HasPrefix(r.who, "heavy") || !errors.Is(r.err, sluice.ErrCostExceedsCapacity) {
				t.Fatalf("%s: %v, %v; want sluice.ErrCostExceedsCapacity", r.who, r.p, r.err)
			}
			t.Logf("%s: %v", r.who, r.err)
		case <-timeout:
			t.Fatal("the heavy waiters were not refused at once")
		}
	}
	if n := queueLen(t, e.rdb, a); n != 1 {
		t.Fatalf("%d waiting, want the light one", n)
	}
	holder.Release(ctx)
	r := <-results
	if r.who != "light" || r.err != nil {
		t.Fatalf("%s: %v", r.who, r.err)
	}
	r.p.Release(ctx)
	// A new arrival above the lowered capacity is refused by Redis.
	if _, err := b.AcquireN(ctx, 3); !errors.Is(err, sluice.ErrCostExceedsCapacity) {
		t.Fatalf("AcquireN(3) on capacity 2: %v", err)
	}
}

// TestLiveChangesUnderLoad: callers in three processes saturate the
// semaphore with weights 1 and 2 while another process changes the
// capacity up and down. Every grant is judged against the capacity in
// force at its instant (either capacity while SetCapacity runs): the
// weight held never exceeds it, and the raised capacities are used.
func TestLiveChangesUnderLoad(t *testing.T) {
	e := newEnv(t)
	cfg := Config{Name: t.Name(), Capacity: 4}
	handles := []*Semaphore{e.sem(t, cfg), e.sem(t, cfg), e.sem(t, cfg)}
	for _, s := range handles { // accepted under 4: they follow
		acquire(t, s, time.Second).Release(context.Background())
	}
	admin := e.sem(t, cfg)
	var changes []change
	steps := []int{8, 2, 6, 3, 7}
	prev := cfg.Capacity
	i := 0
	tick := time.Now()
	ivs := saturateHandles(t, handles, 6, time.Duration(len(steps)+1)*250*time.Millisecond, 2, func() {
		if i == len(steps) || time.Since(tick) < 250*time.Millisecond {
			time.Sleep(time.Millisecond)
			return
		}
		c := change{from: time.Now(), old: prev, new: steps[i]}
		if err := admin.SetCapacity(context.Background(), steps[i]); err != nil {
			t.Error(err)
		}
		c.to = time.Now()
		changes = append(changes, c)
		prev, tick = steps[i], time.Now()
		i++
	})
	if len(changes) != len(steps) {
		t.Fatalf("%d changes made, want %d", len(changes), len(steps))
	}
	peak, over := checkIntervals(ivs, cfg.Capacity, changes)
	t.Logf("%d intervals, peak weight %d, changes %v", len(ivs), peak, steps)
	if over > 0 {
		t.Fatalf("%d grants above the capacity in force", over)
	}
	if peak <= cfg.Capacity {
		t.Fatalf("peak %d: the raises were never used", peak)
	}
}

// change is one SetCapacity: the capacity was old before from, new after
// to, either in between.
type change struct {
	from, to time.Time
	old, new int
}

// weighted is one permit held: from Acquire returning (start) to before
// Release (end), inside the lease Redis granted; Redis granted it between
// asked (Acquire called) and start.
type weighted struct {
	asked, start, end time.Time
	weight            int
}

// checkIntervals judges every grant against the capacity in force when
// Redis granted it (initial, then changes in order; either while
// SetCapacity runs): it returns the most weight held at once and the
// grants that took it above. The clients see a grant after Redis made it:
// a grant is judged against the most in force between its Acquire and
// its start, so a grant made before a lowering and heard of after it is
// not counted; grants wait a few ms here, and capacities stay for 250.
func checkIntervals(ivs []weighted, initial int, changes []change) (peak, over int) {
	capAt := func(t time.Time) int {
		c := initial
		for _, ch := range changes {
			switch {
			case t.Before(ch.from):
				return c
			case t.Before(ch.to):
				return max(ch.old, ch.new)
			}
			c = ch.new
		}
		return c
	}
	// The most in force over [from, to].
	capOver := func(from, to time.Time) int {
		c := max(capAt(from), capAt(to))
		for _, ch := range changes {
			if ch.to.After(from) && ch.from.Before(to) {
				c = max(c, ch.old, ch.new)
			}
		}
		return c
	}
	type edge struct {
		t     time.Time
		d     int
		asked time.Time
	}
	var edges []edge
	for _, iv := range ivs {
		edges = append(edges, edge{iv.start, iv.weight, iv.asked}, edge{iv.end, -iv.weight, time.Time{}})
	}
	sort.Slice(edges, func(i, j int) bool {
		if !edges[i].t.Equal(edges[j].t) {
			return edges[i].t.Before(edges[j].t)
		}
		return edges[i].d < edges[j].d
	})
	n := 0
	for _, e := range edges {
		n += e.d
		peak = max(peak, n)
		if e.d > 0 && n > capOver(e.asked, e.t) {
			over++
		}
	}
	return peak, over
}

// saturateHandles runs callers per handle that acquire a weight from 1 to
// maxWeight, hold it up to 2 ms and release it, for d, while between runs
// in a loop of its own; it returns every interval.
func saturateHandles(t *testing.T, handles []*Semaphore, callers int, d time.Duration, maxWeight int, between func()) []weighted {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var mu sync.Mutex
	var ivs []weighted
	var wg sync.WaitGroup
	var lost atomic.Int64
	for _, s := range handles {
		for range callers {
			wg.Go(func() {
				for ctx.Err() == nil {
					n := 1 + rand.IntN(maxWeight)
					asked := time.Now()
					p, err := s.AcquireN(ctx, n)
					if err != nil {
						if ctx.Err() == nil {
							t.Errorf("AcquireN(%d): %v", n, err)
						}
						return
					}
					start := time.Now()
					time.Sleep(time.Duration(rand.IntN(2000)) * time.Microsecond)
					end := time.Now()
					if err := p.Release(context.Background()); err != nil {
						lost.Add(1)
						end = earliest(end, p.validUntil())
					}
					mu.Lock()
					ivs = append(ivs, weighted{asked, start, end, n})
					mu.Unlock()
				}
			})
		}
	}
	wg.Go(func() {
		for ctx.Err() == nil {
			between()
		}
	})
	wg.Wait()
	if n := lost.Load(); n > 0 {
		t.Errorf("%d leases lost in a healthy run", n)
	}
	return ivs
}

//go:embed testdata/sync_unversioned.lua
var unversionedSource string

// unversioned is the script before the capacity was stored (format 0):
// four keys, no config.
var unversioned = redis.NewScript(unversionedSource)

// TestUnversionedStateMigrated: state written by the code before formats
// (holders, a heavy one among them, and a waiter of a process of that
// version) is migrated in place by the first call: the arriving process's
// capacity is stored with the format, and the old holders and waiter keep
// their places and order.
func TestUnversionedStateMigrated(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	cfg := Config{Name: t.Name(), Capacity: 3}
	s := e.sem(t, cfg)
	old := func(leaseTTL, queueTTL time.Duration, ids ...string) {
		t.Helper()
		args := []interface{}{cfg.Capacity, leaseTTL.Microseconds(), queueTTL.Microseconds(), 0, s.chanPrefix, "aaaa", 0, 0, 0, 0, 0, len(ids)}
		for _, id := range ids {
			args = append(args, id)
		}
		if err := unversioned.Run(ctx, e.rdb, s.keys[:4], args...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	old(400*time.Millisecond, time.Second, "aaaa:1", "aaaa:2:2") // 3 of 3 held
	old(time.Second, time.Second, "bbbb:1")                      // queued
	if n := e.rdb.Exists(ctx, s.keys[4]).Val(); n != 0 {
		t.Fatal("the old script stored a config")
	}
	bbbbEnds := int64(e.rdb.ZScore(ctx, s.keys[0], "bbbb:1").Val())

	got := make(chan *Permit, 1)
	go func() {
		p, err := s.AcquireN(ctx, 3)
		if err != nil {
			t.Error(err)
		}
		got <- p
	}()
	waitFor(t, time.Second, "the new process to queue", func() bool { return queueLen(t, e.rdb, s) == 2 })
	if conf := e.rdb.HGetAll(ctx, s.keys[4]).Val(); conf[fieldFormat] != storeFormat || conf[fieldCapacity] != "3" {
		t.Fatalf("config after migration %v, want format %s, capacity 3", conf, storeFormat)
	}
	if q := e.rdb.ZRange(ctx, s.keys[1], 0, -1).Val(); len(q) != 2 || q[0] != "bbbb:1" {
		t.Fatalf("queue %v, want the old waiter first", q)
	}
	// A process with another capacity now meets the migrated one.
	other := e.sem(t, Config{Name: t.Name(), Capacity: 5})
	if _, err := other.Acquire(ctx); !errors.Is(err, sluice.ErrConfigMismatch) {
		t.Fatalf("another capacity after the migration: %v, want sluice.ErrConfigMismatch", err)
	}

	var p *Permit
	select {
	case p = <-got:
	case <-time.After(5 * time.Second):
		t.Fatal("the new process was never served")
	}
	now := e.rdb.Time(ctx).Val().UnixMicro()
	if now < bbbbEnds {
		t.Fatalf("weight 3 granted %d µs before the old waiter's lease ended", bbbbEnds-now)
	}
	if w := heldWeight(t, e.rdb, s); w != 3 {
		t.Fatalf("Redis counts %d held, want the new permit's 3 alone", w)
	}
	if ids := e.rdb.ZRange(ctx, s.keys[0], 0, -1).Val(); !slices.Equal(ids, []string{p.id}) {
		t.Fatalf("leases %v, want %s alone", ids, p.id)
	}
	p.Release(ctx)
}

// TestFutureFormatRefused: state in a format this code does not know is
// refused by every call, with an error naming the format, and left as it
// is.
func TestFutureFormatRefused(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	cfg := Config{Name: t.Name(), Capacity: 3}
	s := e.sem(t, cfg)
	if err := e.rdb.HSet(ctx, s.keys[4], fieldFormat, "2", fieldCapacity, "3", "novel", "x").Err(); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err := s.Acquire(short)
	if !errors.Is(err, errUnknownFormat) || !strings.Contains(err.Error(), "format 2") {
		t.Fatalf("Acquire on format 2: %v, want an error naming format 2", err)
	}
	t.Log(err)
	if err := s.SetCapacity(ctx, 4); !errors.Is(err, errUnknownFormat) || !strings.Contains(err.Error(), "format 2") {
		t.Fatalf("SetCapacity on format 2: %v", err)
	}
	if _, err := s.Capacity(ctx); !errors.Is(err, errUnknownFormat) || !strings.Contains(err.Error(), "format 2") {
		t.Fatalf("Capacity on format 2: %v", err)
	}
	if keys := e.rdb.Keys(ctx, "*").Val(); len(keys) != 1 {
		t.Fatalf("keys %v, want the config alone: nothing written", keys)
	}
	if conf := e.rdb.HGetAll(ctx, s.keys[4]).Val(); conf[fieldFormat] != "2" || conf[fieldCapacity] != "3" || len(conf) != 3 {
		t.Fatalf("config %v changed", conf)
	}
}

// TestStoredConfig: what SetCapacity stores is what Capacity reads, and
// shapes the code does not write are errors.
func TestStoredConfig(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	s := e.sem(t, Config{Name: t.Name(), Capacity: 3})
	if n, err := s.Capacity(ctx); err != nil || n != 3 {
		t.Fatalf("Capacity with none stored: %d, %v; want its own 3", n, err)
	}
	if err := s.SetCapacity(ctx, 7); err != nil {
		t.Fatal(err)
	}
	if conf := e.rdb.HGetAll(ctx, s.keys[4]).Val(); len(conf) != 2 || conf[fieldFormat] != storeFormat || conf[fieldCapacity] != "7" {
		t.Fatalf("stored %v", conf)
	}
	if ttl := e.rdb.PTTL(ctx, s.keys[4]).Val(); ttl <= keepConfig-time.Minute || ttl > keepConfig {
		t.Fatalf("config TTL %v, want %v", ttl, keepConfig)
	}
	if n, err := s.Capacity(ctx); err != nil || n != 7 {
		t.Fatalf("Capacity: %d, %v; want 7", n, err)
	}
	if err := s.SetCapacity(ctx, 0); !errors.Is(err, errConfig) {
		t.Fatalf("SetCapacity(0): %v, want errConfig", err)
	}
	for _, tc := range []struct {
		format, capacity interface{}
		ok               bool
	}{
		{nil, nil, false},
		{"1", "5", true},
		{"1", nil, false},
		{nil, "5", false},
		{"1", "0", false},
		{"1", "x", false},
		{"2", "5", false},
	} {
		n, ok, err := s.parseStored(tc.format, tc.capacity)
		if ok != tc.ok || (tc.ok && (err != nil || n != 5)) || (!tc.ok && tc.format != nil && err == nil) {
			t.Errorf("parseStored(%v, %v) = %d, %v, %v", tc.format, tc.capacity, n, ok, err)
		}
	}
}
