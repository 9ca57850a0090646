package bucket

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/upstream"
)

// The upstream's word: Hold, Sync and Feedback apply what an upstream API
// said (a Retry-After, a "remaining" counter) to the bucket, for every
// process at once, in one script each (queue/lua/feedback.lua). See
// docs/upstream.md.

var _ upstream.Receiver = (*Bucket)(nil)

// syncEvery is how often, at most, Feedback syncs one policy from this
// process: every response of a busy client reports the same quota, and
// one sync per interval keeps the level in line at a fraction of the cost
// of a round trip per response.
const syncEvery = 50 * time.Millisecond

// Hold stops every process's grants for d from now, on the Redis clock:
// of every caller, or, when units are given, of the callers whose cost
// takes from a policy counting one of them. Callers already queued are
// re-timed after the hold, in their order. A held policy gains nothing
// during the hold (its refills resume at its end) and keeps the tokens it
// had: a long one, such as a monthly quota, keeps its budget, and one the
// upstream's refusal found saturated comes out of the hold empty, never
// a burst of what would have accrued. A hold never shortens a wait, and a
// second hold extends the first. The
// one exception: slots already handed out (due within the lookahead, 20
// ms by default) keep their times; Hold returns how many such slots it
// left standing. A unit no policy counts is an error.
func (b *Bucket) Hold(ctx context.Context, d time.Duration, units ...string) (int, error) {
	if d <= 0 {
		return 0, nil
	}
	r, err := b.feedback(ctx, func(ps []Policy) (hold time.Duration, held []int, syncs []queueio.Sync, err error) {
		for _, u := range units {
			n := 0
			for i, p := range ps {
				if p.Unit == u {
					held, n = append(held, i), n+1
				}
			}
			if n == 0 {
				return 0, nil, nil, fmt.Errorf("bucket: Hold of unit %s, which no policy of bucket %q counts", unitName(u), b.cfg.Name)
			}
		}
		return d, held, nil, nil
	})
	return r.Owed, err
}

// Sync brings the level of the policy q describes down to q.Remaining, for
// every process at once, and when it lowered it, resumes that policy's
// refills no sooner than q.Reset from now; when q.UntilFull (q.Reset is
// the time until the upstream's quota is full again at its steady rate,
// as OpenAI and Anthropic say it), the refills go on at the policy's
// rate, not delayed: holding them until the quota is full would stall
// every process for up to a window. It never raises a level. The
// policy is the one counting q.Unit whose Capacity is q.Limit; else,
// when q.Window is known, the one whose time to fill from empty is
// nearest to it; else the one of that unit that fills fastest. A quota
// of a unit no policy counts changes nothing. It reports whether the
// level was lowered.
func (b *Bucket) Sync(ctx context.Context, q upstream.Quota) (bool, error) {
	r, err := b.feedback(ctx, func(ps []Policy) (time.Duration, []int, []queueio.Sync, error) {
		if i := policyFor(q, ps); i >= 0 {
			return 0, nil, []queueio.Sync{syncOf(i, q)}, nil
		}
		return 0, nil, nil, nil
	})
	return r.Lowered > 0, err
}

// Feedback applies what one response of the upstream said, in one round
// trip at most (upstream.Receiver): a RetryAfter holds every policy
// (Hold); each quota syncs its policy (Sync), at most once every 50 ms
// per policy from this process; quotas of units no policy counts are
// ignored. A signal that asks for nothing costs nothing. With
// Config.Adapt, a refusal for the upstream's limit (not a 503: an outage)
// also lowers the rate in force (one more round trip, at most once a
// second fleet-wide), to the rate its quotas say when they say one, and
// any other signal may raise it back; and such a refusal's Retry-After
// in whole seconds holds only until its quotas say requests come back,
// when they say it within its last second (see Config.Adapt).
func (b *Bucket) Feedback(ctx context.Context, s upstream.Signal) error {
	hold := s.RetryAfter
	if b.cfg.Adapt {
		// An outage's 503 is not the upstream's limit: it holds, it does
		// not slow the fleet after it.
		if s.Refused && s.Status != http.StatusServiceUnavailable {
			if err := b.adaptStep(ctx, true, s.Quotas); err != nil {
				return err
			}
			hold = refusalHold(s)
		} else {
			b.maybeAdaptUp()
		}
	}
	_, err := b.feedback(ctx, func(ps []Policy) (time.Duration, []int, []queueio.Sync, error) {
		var syncs []queueio.Sync
		for _, q := range s.Quotas {
			if i := policyFor(q, ps); i >= 0 && (s.RetryAfter > 0 || b.syncs.due(i, len(ps), b.now())) {
				syncs = append(syncs, syncOf(i, q))
			}
		}
		return hold, nil, syncs, nil
	})
	return err
}

// feedback runs feedback.lua with what plan makes of the policies in
// force, following them as every call does.
func (b *Bucket) feedback(ctx context.Context, plan func([]Policy) (time.Duration, []int, []queueio.Sync, error)) (queueio.FeedbackResult, error) {
	for settled := 0; ; settled++ {
		id, qps := b.runsUnder()
		hold, held, syncs, err := plan(fromQueue(qps))
		if err != nil || (hold <= 0 && len(syncs) == 0) {
			return queueio.FeedbackResult{}, err
		}
		r, err := b.q.Feedback(ctx, id, hold, held, syncs)
		retry, serr := b.followInForce(ctx, err, settled)
		switch {
		case retry:
			continue
		case serr != nil:
			return r, serr
		case err != nil:
			return r, b.redisErr(ctx, err)
		}
		return r, nil
	}
}

// syncOf is the sync of policy i to quota q: refills resume at once (Reset
// 0) for a quota that refills all along (q.UntilFull), at q.Reset from now
// otherwise.
func syncOf(i int, q upstream.Quota) queueio.Sync {
	s := queueio.Sync{Policy: i, Remaining: q.Remaining, Reset: q.Reset}
	if q.UntilFull {
		s.Reset = 0
	}
	return s
}

// policyFor is the index of the policy quota q describes (see Sync), or
// -1 when no policy counts its unit.
func policyFor(q upstream.Quota, ps []Policy) int {
	best := -1
	var bestFit time.Duration
	for i, p := range ps {
		if p.Unit != q.Unit {
			continue
		}
		if q.Limit > 0 && int64(p.Capacity) == q.Limit {
			return i
		}
		fill := time.Duration(p.Capacity) * p.RefillFrequency / time.Duration(p.RefillAmount)
		fit := fill
		if q.Window > 0 {
			fit = max(fill-q.Window, q.Window-fill)
		}
		if best < 0 || fit < bestFit {
			best, bestFit = i, fit
		}
	}
	return best
}

// syncClock remembers when this process last synced each policy.
type syncClock struct {
	mu   sync.Mutex
	last []time.Time
}

// due reports whether policy i (of n) may be synced now, and if so notes it.
func (c *syncClock) due(i, n int, now time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.last) != n {
		c.last = make([]time.Time, n)
	}
	if now.Sub(c.last[i]) < syncEvery {
		return false
	}
	c.last[i] = now
	return true
}

// Adapt's rule (Config.Adapt): on a refusal, a step straight to the rate
// the upstream's quotas say, when they say one (see saidFactor), else a
// multiplicative decrease of every policy's refill rate; then a climb back
// that remembers where the upstream refused (as CUBIC and the AWS SDK's
// adaptive retry mode do, inside one process; here the fleet adapts
// together, in Redis): fast to just under that rate, then a slow probe
// above it. A refusal costs the fleet its hold, so the rule aims to
// refuse seldom.
const (
	adaptDown    = 0.85             // a refusal that says no rate multiplies the rate in force by this
	adaptFloor   = 1.0 / 16         // never below this share of the configured rate
	adaptNear    = 0.95             // the climb is fast up to this share of the rate last refused
	adaptProbe   = 0.01             // then each step adds this share of the configured rate
	adaptFar     = 0.05             // or this, once the last refusal is adaptLong old
	adaptLong    = 30 * time.Second // see adaptFar
	adaptEvery   = time.Second      // at most one step (down or up) per this, fleet-wide
	adaptQuiet   = 2 * time.Second  // steps up only this long after the last step down
	adaptMinStep = 0.01             // the least a fast step adds
)

// adaptStep lowers (down) or raises the rate in force for every process
// by Adapt's rule, when the rule allows a step now on the Redis clock. said
// are the quotas the refusal reported, for a step down.
func (b *Bucket) adaptStep(ctx context.Context, down bool, said []upstream.Quota) error {
	r, err := b.q.Change(ctx, int(AsIs), func(old protocol.Config, now time.Time) (protocol.Config, bool) {
		base, f := old.Base, old.Factor
		if len(base) == 0 || f <= 0 {
			base, f = old.Policies, 1
		}
		t := now.UnixMicro()
		since := func(at int64) time.Duration { return time.Duration(t-at) * time.Microsecond }
		if down {
			if since(old.DownAt) < adaptEvery {
				return old, false // the refusals of one episode count once
			}
			peak := f
			if sf := saidFactor(said, fromQueue(base)); sf > 0 {
				if sf >= f {
					// The rate in force is within what the upstream
					// says: the refusal is not for the rate (a request
					// crossing the network faster than the one before
					// it), and the hold deals with it.
					return old, false
				}
				// Climb from here only by the slow probe: the upstream
				// said its rate.
				f = max(sf, adaptFloor)
				peak = f
			} else {
				f = max(f*adaptDown, adaptFloor)
			}
			return protocol.Config{Policies: slowed(base, f), Base: base, Factor: f, DownAt: t, UpAt: old.UpAt, Peak: peak}, true
		}
		if f >= 1 || since(old.DownAt) < adaptQuiet || since(old.UpAt) < adaptEvery {
			return old, false
		}
		peak := old.Peak
		if peak <= 0 {
			peak = 1
		}
		switch near := adaptNear * peak; {
		case since(old.DownAt) >= adaptLong:
			f += adaptFar
		case f < near:
			f += max((near-f)/2, adaptMinStep)
		default:
			f += adaptProbe
		}
		if f >= 1 {
			return protocol.Config{Policies: base}, true // back at the configured rate
		}
		return protocol.Config{Policies: slowed(base, f), Base: base, Factor: f, DownAt: old.DownAt, UpAt: t, Peak: peak}, true
	})
	if err != nil {
		return b.redisErr(ctx, err)
	}
	b.noteFactor(r.New)
	if r.Changed && r.Queued > 0 {
		b.sched.Ensure()
	}
	return nil
}

// saidFactor is the share of the configured rate that a refusal's quotas
// say the upstream allows: the least, over the quotas it found exhausted
// (Remaining 0) that say their rate (saidRate), of that rate over the
// configured rate of the policy the quota steers (the one Sync picks); 0
// when none says it.
func saidFactor(qs []upstream.Quota, base []Policy) float64 {
	f := 0.0
	for _, q := range qs {
		i := policyFor(q, base)
		r := saidRate(q)
		if q.Remaining > 0 || i < 0 || r <= 0 {
			continue
		}
		p := base[i]
		if share := r / (float64(p.RefillAmount) / p.RefillFrequency.Seconds()); f == 0 || share < f {
			f = share
		}
	}
	return f
}

// saidRate is the rate, per second, at which quota q says the upstream
// refills it, or 0 when it does not say: Limit over Window (the IETF
// draft's w=); or, for a quota that refills all along (UntilFull: OpenAI,
// Anthropic), what is missing over the time to refill it, counting one
// less than Limit − Remaining: Remaining is rounded down, so more than
// that is missing, and the rate read is never above the upstream's.
func saidRate(q upstream.Quota) float64 {
	switch {
	case q.Limit > 0 && q.Window > 0:
		return float64(q.Limit) / q.Window.Seconds()
	case q.UntilFull && q.Reset > 0 && q.Limit-q.Remaining > 1:
		return float64(q.Limit-q.Remaining-1) / q.Reset.Seconds()
	}
	return 0
}

// refusalHold is how long a refusal for the upstream's limit holds every
// process, with Adapt: its Retry-After, or less when that is a whole
// number of seconds (an upstream rounds it up to one at least) and every
// quota the refusal found exhausted says when it is back within the
// Retry-After's last second (backIn): then the latest of those. A
// Retry-After that quotas do not explain so (a longer penalty, a limit
// no header reports) holds in full.
func refusalHold(s upstream.Signal) time.Duration {
	ra := s.RetryAfter
	if ra <= 0 || ra%time.Second != 0 {
		return ra
	}
	var back time.Duration
	for _, q := range s.Quotas {
		if q.Remaining > 0 {
			continue
		}
		d := backIn(q)
		if d <= 0 {
			return ra
		}
		back = max(back, d)
	}
	if back <= ra-time.Second || back >= ra {
		return ra
	}
	return back
}

// backIn is how soon an exhausted quota q says the next request may pass,
// or 0 when it does not say: for calls refilling all along with a known
// Limit, the time one of Limit comes back (Reset ÷ Limit: a whole one is
// back by then whatever fraction was left); else its Reset, when it is
// all back (a window's end, or full again).
func backIn(q upstream.Quota) time.Duration {
	if q.UntilFull && q.Unit == "" && q.Limit > 0 {
		return (q.Reset + time.Duration(q.Limit) - 1) / time.Duration(q.Limit)
	}
	return q.Reset
}

// slowed is ps with every refill f times as fast (f ≤ 1): the period
// divided by f, rounded up to a whole microsecond.
func slowed(ps []protocol.Policy, f float64) []protocol.Policy {
	out := slices.Clone(ps)
	for i, p := range out {
		us := float64(p.RefillFrequency.Microseconds()) / f
		out[i].RefillFrequency = time.Duration(math.Ceil(us)) * time.Microsecond
	}
	return out
}

// noteFactor records whether the configuration in force is slowed by
// Adapt, so that this process knows to try steps up.
func (b *Bucket) noteFactor(c protocol.Config) {
	b.adapting.Store(len(c.Base) > 0 && c.Factor > 0 && c.Factor < 1)
}

// maybeAdaptUp tries a step up in the background, at most once per
// adaptEvery from this process, while the rate in force is slowed.
func (b *Bucket) maybeAdaptUp() {
	if !b.cfg.Adapt || !b.adapting.Load() {
		return
	}
	now := b.now().UnixNano()
	last := b.adaptTried.Load()
	if now-last < int64(adaptEvery) || !b.adaptTried.CompareAndSwap(last, now) {
		return
	}
	b.bg.Go(func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, b.cfg.LockTTL)
		defer cancel()
		_ = b.adaptStep(ctx, false, nil) // a failure only delays the step up
	})
}
