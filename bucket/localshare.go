package bucket

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/hub"
	"github.com/sluicehq/sluice/internal/presence"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/internal/rediscall"
	"github.com/sluicehq/sluice/queue"
)

// The local share (Config.Fallback = LocalShare; docs/guarantees.md, "When
// Redis is unreachable").
//
// While it has callers, a Bucket leaves a trace in Redis once a second
// (internal/presence) and reads how many handles left one within 5 s: n.
// It watches Redis's reachability (internal/hub's probe) and bounds each
// of its calls by hub.AwayAfter. When a call finds Redis unreachable, or
// the probe marks it away, the Bucket switches to its local share: one
// token bucket per policy in force with 1/n of its capacity and of its
// refill, starting at 1/n of (capacity − the refill of one lookahead, the
// tokens Redis may already have promised to slots still to come). Callers
// queued in Redis at the switch book their local slots first, in their
// arrival order; later callers book theirs first come first served. Each
// booking takes its cost at the latest of its own tokens' instant and the
// previous booking's (FIFO, as Redis does), from every policy at once; a
// cost above the share's capacity waits for a full share and leaves it
// below zero.
//
// At the probe's first answer, the next caller charges Redis with what
// the share granted and has not refilled (capacity − level of each
// policy: queue.Settle, a debt at Redis's now, which finds a bucket Redis
// lost full and leaves it at what the fleet's shares hold), and the
// Bucket returns to Redis. Callers arriving meanwhile wait for the charge.
// Over the outage and the return together, the fleet then grants at most
// the bucket's promise plus one Capacity (the switch), as long as n is
// right: a handle that starts during the outage counts nowhere.

// localShare is a Bucket's fallback under Config.Fallback = LocalShare.
type localShare struct {
	b     *Bucket
	trace *presence.Trace

	wmu      sync.Mutex
	watchers int
	unwatch  func()

	mu          sync.Mutex
	local       bool      // admitting from the share
	since       time.Time // local clock: the switch
	n           int       // the handles the share divides by
	caps, rates []float64 // per policy: the share's tokens, and its refill per ns
	levels      []float64 // per policy, at `at`
	at          time.Time // local clock: the last booking, or the switch
	units       []string  // per policy: its Unit (Enter's cost is 1 of "")
	granted     int64     // callers admitted by the share since the switch
	queued      map[string]*queuedCaller
	switched    chan struct{} // closed at the switch to local
	charging    chan struct{} // non-nil while the return's charge runs
}

// queuedCaller is a caller queued in Redis, for the switch to book it in
// arrival order.
type queuedCaller struct {
	ticket int64
	costs  []int64
	slot   time.Time // booked at the switch; zero until then
}

func newLocalShare(b *Bucket) *localShare {
	return &localShare{
		b:        b,
		trace:    presence.New(b.hub.Pipelining(), b.keys.Procs),
		queued:   make(map[string]*queuedCaller),
		switched: make(chan struct{}),
	}
}

// begin counts a caller in: the probe runs while there is one, and a trace
// is left when one is due. The returned func counts it out.
func (f *localShare) begin() (end func()) {
	f.wmu.Lock()
	f.watchers++
	if f.watchers == 1 {
		f.unwatch = f.b.hub.Watch()
	}
	f.wmu.Unlock()
	if away, _ := f.b.hub.Away(); !away && !f.isLocal() && f.trace.Due(f.b.now()) {
		f.b.bg.Go(func(ctx context.Context) {
			ctx, cancel := context.WithTimeout(ctx, rediscall.AnswerWithin)
			defer cancel()
			if err := f.trace.Send(ctx); err != nil && hub.Unreachable(err) && ctx.Err() == nil {
				f.b.hub.MarkAwayBecause(fmt.Errorf("presence trace: %w", err))
			}
		})
	}
	return func() {
		f.wmu.Lock()
		f.watchers--
		if f.watchers == 0 {
			f.unwatch()
			f.unwatch = nil
		}
		f.wmu.Unlock()
	}
}

func (f *localShare) isLocal() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.local
}

// serving reports whether a caller goes to the share now: the bucket is
// local, or the probe has marked Redis away and the bucket can switch.
func (f *localShare) serving() bool {
	if f.isLocal() {
		return true
	}
	if away, _ := f.b.hub.Away(); away {
		return f.goLocal()
	}
	return false
}

// away reports whether err, a failed call's, means Redis is unreachable
// and the bucket has switched to its share (marking Redis away for every
// handle on the client): the caller is then served locally. A call cut
// short by its caller's ctx, or failed with an answer from Redis, is not.
func (f *localShare) away(ctx context.Context, err error) bool {
	if err == nil || ctx.Err() != nil || !hub.Unreachable(err) {
		return false
	}
	var cerr *queueio.ConfigError
	if errors.As(err, &cerr) || errors.Is(err, queue.ErrNotReplicated) {
		return false
	}
	f.b.hub.MarkAwayBecause(err)
	return f.goLocal()
}

// answers waits for the probe's verdict after a call made at since ran
// out of its bound: true once the probe had an answer after since (Redis
// is slow, not away), false once Redis is marked away (the bucket then
// switches) or ctx ends.
func (f *localShare) answers(ctx context.Context, since time.Time) bool {
	if f.b.hub.AwaitVerdict(ctx, since, time.Time{}) {
		return true
	}
	if away, _ := f.b.hub.Away(); away && ctx.Err() == nil {
		f.goLocal()
	}
	return false
}

// answerWithin bounds a call: a frozen Redis sends a caller in flight to
// its share this soon (the probe's verdict, AwayAfter, and a round of it
// to spare).
func (f *localShare) answerWithin() time.Duration {
	return hub.AwayAfter + 2*hub.ProbeEvery
}

// reach tells a queued caller that Redis's reachability changed, for it
// to go to the share.
func (f *localShare) reach() <-chan struct{} {
	_, reach := f.b.hub.Away()
	return reach
}

// say logs msg through the Logger: at level for the first bucket on the
// client to say this switch, at Debug for the others.
func (f *localShare) say(level slog.Level, msg string, args ...any) {
	f.b.hub.Say(f.b.cfg.Logger, level, msg, append(args, "bucket", f.b.cfg.Name)...)
}

// goLocal switches to the local share, unless the bucket is local already
// (true) or knows no share (false: no trace read yet, or a window in
// force).
func (f *localShare) goLocal() bool {
	f.mu.Lock()
	if f.local {
		f.mu.Unlock()
		return true
	}
	n := f.trace.Count()
	ps := f.b.inForce()
	windowed := slices.ContainsFunc(ps, func(p Policy) bool { return p.Kind != TokenBucket })
	if n <= 0 || windowed {
		f.mu.Unlock()
		why := "this process has not reached Redis since it started, so it knows no share"
		if windowed {
			why = "a window is in force, which the local share cannot serve"
		}
		f.say(slog.LevelWarn, "sluice: Redis unreachable; no local share: "+why)
		return false
	}
	now := f.b.now()
	f.local, f.since, f.n, f.at, f.granted = true, now, n, now, 0
	f.caps, f.rates, f.levels, f.units = make([]float64, len(ps)), make([]float64, len(ps)), make([]float64, len(ps)), make([]string, len(ps))
	for i, p := range ps {
		f.caps[i] = float64(p.Capacity) / float64(n)
		f.rates[i] = float64(p.RefillAmount) / float64(p.RefillFrequency) / float64(n)
		f.levels[i] = f.caps[i] - f.rates[i]*float64(f.b.cfg.Lookahead)
		f.units[i] = p.Unit
	}
	// Callers queued in Redis first, in their arrival order.
	qs := make([]*queuedCaller, 0, len(f.queued))
	for _, q := range f.queued {
		qs = append(qs, q)
	}
	slices.SortFunc(qs, func(a, b *queuedCaller) int { return int(a.ticket - b.ticket) })
	for _, q := range qs {
		q.slot = f.bookLocked(q.costs, now)
	}
	close(f.switched)
	f.mu.Unlock()
	f.say(slog.LevelWarn, fmt.Sprintf("sluice: Redis unreachable; admitting from this process's local share, 1/%d of the limit, until it answers (said once per client; the other buckets' switches at Debug)", n),
		"queued", len(qs), "cause", f.b.hub.Cause())
	return true
}

// bookLocked takes costs (nil: Enter's) from every policy of the share at
// the earliest instant they are there, not before the previous booking,
// and returns it. f.mu is held.
func (f *localShare) bookLocked(costs []int64, now time.Time) time.Time {
	t, _ := f.bookWithinLocked(costs, now, 0)
	return t
}

// bookWithinLocked is bookLocked for a caller that may wait at most
// within (0: no bound): when the instant is later than that, it books
// nothing and returns it with false. f.mu is held.
func (f *localShare) bookWithinLocked(costs []int64, now time.Time, within time.Duration) (time.Time, bool) {
	cost := func(i int) float64 {
		if costs == nil {
			if f.units[i] == "" {
				return 1
			}
			return 0
		}
		if i < len(costs) {
			return float64(costs[i])
		}
		return 0
	}
	t := now
	if f.at.After(t) {
		t = f.at
	}
	for i := range f.levels {
		need := min(cost(i), f.caps[i])
		lvl := f.levelAt(i, t)
		if lvl < need {
			wait := time.Duration(math.Ceil((need - lvl) / f.rates[i]))
			if at := t.Add(wait); at.After(t) {
				t = at
			}
		}
	}
	if within > 0 && t.Sub(now) > within {
		return t, false
	}
	for i := range f.levels {
		f.levels[i] = f.levelAt(i, t) - cost(i)
	}
	f.at = t
	f.granted++
	return t, true
}

// levelAt is policy i's level at t ≥ f.at, refilled and capped; before
// f.at (bookings reach into the future), the level less the refills still
// to come until then.
func (f *localShare) levelAt(i int, t time.Time) float64 {
	d := float64(t.Sub(f.at))
	if d < 0 {
		return f.levels[i] + f.rates[i]*d
	}
	return min(f.caps[i], f.levels[i]+f.rates[i]*d)
}

// queue registers a caller queued in Redis under entry, for the switch to
// book it in order; forget must be called when it leaves the queue.
func (f *localShare) queue(entry string, ticket int64, costs []int64) (switched <-chan struct{}, forget func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.queued[entry] == nil {
		f.queued[entry] = &queuedCaller{ticket: ticket, costs: costs}
	}
	return f.switched, func() {
		f.mu.Lock()
		delete(f.queued, entry)
		f.mu.Unlock()
	}
}

// admit serves a caller from the local share: it books its slot (the one
// the switch booked for entry, if any) and sleeps until it. It returns
// errBack when the bucket went back to Redis before the caller booked:
// the caller enters there.
func (f *localShare) admit(ctx context.Context, entry string, costs []int64, rep *Report) error {
	var booked time.Time // at the switch, for a caller queued in Redis
	if entry != "" {
		f.mu.Lock()
		if q := f.queued[entry]; q != nil {
			booked = q.slot
			delete(f.queued, entry)
		}
		f.mu.Unlock()
	}
	for tried := false; ; {
		f.mu.Lock()
		if !f.local {
			f.mu.Unlock()
			return errBack
		}
		if away, _ := f.b.hub.Away(); !away && f.charging == nil && !tried {
			f.mu.Unlock()
			tried = true // once: a charge Redis refuses is not tried in a loop
			if f.charge(ctx) {
				return errBack
			}
			continue
		}
		if ch := f.charging; ch != nil {
			f.mu.Unlock()
			select { // the charge is one bounded round trip
			case <-ch:
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		slot := booked
		if slot.IsZero() {
			// As on Redis, a caller whose turn comes after its deadline
			// (or, for TryEnter, later than at once) is refused at
			// once and takes nothing.
			now, own := f.b.now(), f.b.ownWait(ctx)
			var ok bool
			if slot, ok = f.bookWithinLocked(costs, now, f.b.mayWait(own)); !ok {
				f.mu.Unlock()
				rep.Local = true
				return f.b.tooLong(slot.Sub(now), own)
			}
		}
		f.mu.Unlock()
		rep.Local = true
		err := f.b.hub.Sleep(ctx, slot.Sub(f.b.now()), f.b.bg.Done())
		if errors.Is(err, hub.ErrStopped) {
			return errClosed
		}
		return err // a caller that gives up spends its local tokens
	}
}

// charge returns the bucket to Redis: it charges Redis, in one settle,
// with what the share granted and has not refilled, then leaves the
// local share. It reports whether the bucket is back on Redis.
func (f *localShare) charge(ctx context.Context) bool {
	f.mu.Lock()
	if !f.local || f.charging != nil {
		f.mu.Unlock()
		return !f.local
	}
	ch := make(chan struct{})
	f.charging = ch
	now := f.b.now()
	id, ps := f.b.runsUnder()
	diffs := make([]int64, len(ps))
	var total int64
	if len(ps) == len(f.levels) {
		for i := range f.levels {
			diffs[i] = int64(math.Ceil(f.caps[i] - f.levelAt(i, now) - 1e-9))
			diffs[i] = max(diffs[i], 0)
			total += diffs[i]
		}
	}
	n, granted, since := f.n, f.granted, f.since
	f.mu.Unlock()

	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rediscall.AnswerWithin)
	err := f.b.q.Settle(cctx, id, 0, diffs)
	cancel()
	var cerr *queueio.ConfigError
	dropped := errors.As(err, &cerr) // the policies changed meanwhile: nothing to charge them with
	back := err == nil || dropped
	if !back && hub.Unreachable(err) {
		f.b.hub.MarkAwayBecause(fmt.Errorf("charge: %w", err))
	}

	f.mu.Lock()
	f.charging = nil
	if back {
		f.local = false
		f.switched = make(chan struct{})
		for _, q := range f.queued {
			q.slot = time.Time{}
		}
	}
	f.mu.Unlock()
	close(ch)
	switch {
	case dropped:
		f.say(slog.LevelWarn, "sluice: Redis answers again; back on Redis, without charging the local share's grants (the policies in force changed)",
			"local_for", f.b.now().Sub(since).Round(time.Millisecond), "granted_locally", granted)
	case back:
		f.say(slog.LevelInfo, fmt.Sprintf("sluice: Redis answers again; back on Redis after %v on 1/%d of the limit, charged with the %d tokens the share had not refilled",
			f.b.now().Sub(since).Round(time.Millisecond), n, total),
			"granted_locally", granted)
	}
	return back
}

// state is this process's side of the share, for Stats and Inspect.
func (f *localShare) state() (local bool, since time.Time, n int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.local, f.since, f.n
}
