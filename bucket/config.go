package bucket

import (
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/configerr"
	"github.com/sluicehq/sluice/internal/lane"
	"github.com/sluicehq/sluice/internal/rediskey"
)

// Defaults of the optional Config fields.
const (
	defaultLockTTL     = time.Second
	defaultLookahead   = 20 * time.Millisecond
	defaultMaxLateness = 25 * time.Millisecond
	// minMaxLateness is the least MaxLateness (but negative) a caller can
	// keep: a timer, the reply's trip and the judge's conservative
	// reckoning (start.go's sleepLate) make a caller a few hundred µs late
	// on a quiet host. With 1 µs every caller was retimed again and
	// again, and an Enter without a deadline never returned.
	minMaxLateness = time.Millisecond
	// batchTimeout bounds an arrival call the batcher makes for several
	// callers (each caller still returns at its own deadline).
	batchTimeout = 5 * time.Second
	// checkIn is the longest a queued caller goes without polling Redis:
	// with rediscall.AnswerWithin and the PING that follows a call out
	// of it, it makes Enter's bound on failing while Redis is away (3 s). A caller waiting longer than that polls
	// once a second, a small cost against its wait.
	checkIn = time.Second
)

// Config describes a bucket. Every process sharing a bucket uses the same
// Name and KeyPrefix. The policies (Capacity, RefillAmount,
// RefillFrequency and Policies) live in Redis: the first process to use
// the bucket stores its own, every process enforces the ones stored, and
// a process whose policies differ fails with sluice.ErrConfigMismatch instead of
// applying them, unless it follows the ones in force (Adopt, and
// SetPolicies). The other fields are this process's own.
type Config struct {
	// Name identifies the shared quota. Any non-empty byte string is valid.
	Name string
	// Capacity is the most tokens the bucket holds: the largest burst. ≥ 1.
	// Capacity, RefillAmount and RefillFrequency are the bucket's policy
	// counting calls (Unit ""); they may be left zero when Policies holds
	// every policy.
	Capacity int
	// RefillAmount tokens are added every RefillFrequency, up to Capacity.
	// 1 ≤ RefillAmount ≤ Capacity.
	RefillAmount int
	// RefillFrequency is the time between refills; a whole number of
	// microseconds, at least one.
	RefillFrequency time.Duration
	// Policies are the bucket's other policies, each with its own unit and
	// the same rules as the fields above. Several may count the same unit
	// over different windows (1,000 units a minute and 400,000 a month).
	Policies []Policy

	// KeyPrefix starts every Redis key of the bucket,
	// "<KeyPrefix>:{<Name>}:..."; "" means "sluice". It may not contain
	// '{' or '}' (they would break the hash tag).
	KeyPrefix string
	// LockTTL is the scheduler lock's lifetime, renewed while it works. When
	// the scheduler's process dies, waiting callers take over within about
	// LockTTL. 0 means 1 s; otherwise at least 10 ms.
	LockTTL time.Duration
	// MaxQueue refuses Enter with sluice.ErrQueueFull when this many callers
	// already wait (in the caller's lane, with WithLane), whatever their
	// costs. 0 means unbounded.
	MaxQueue int
	// Lanes are the lanes whose callers are served differently from the
	// default, by weight and priority (Lane, WithLane). A lane not listed
	// has weight 1 and priority 0. Every process of the bucket should
	// list the same lanes: each caller's lane goes to Redis with the
	// weight and priority its own process gives it.
	Lanes []Lane
	lanes map[string]lane.Spec // Lanes by name (withDefaults)
	// MaxWait refuses Enter with sluice.ErrWaitTooLong when the estimated wait is
	// longer; the estimate counts the costs of the callers ahead and the
	// caller's own. 0 means unbounded; otherwise at least 1 µs. Whatever MaxWait, a caller whose ctx
	// has a deadline is refused the same way when its estimated wait
	// passes that deadline (see Enter).
	MaxWait time.Duration
	// Lookahead is how far ahead slots are handed out: a caller whose token
	// is due within it gets it without queueing, and the scheduler assigns
	// slots this far ahead. A caller that cancels after its slot was
	// assigned passes its token on (see Enter). 0 means 20 ms, or, when a
	// lane has a Priority, one refill of the fastest policy (the time it
	// adds one token; 1 to 20 ms): a caller of a higher priority then
	// finds at most that much handed out to lower lanes ahead of it.
	// Otherwise at least 1 ms and at most LockTTL/2.
	Lookahead time.Duration
	// Adopt makes this process enforce the policies in force in Redis when
	// they differ from its own, instead of failing with
	// sluice.ErrConfigMismatch. Without it, a process follows the policies in
	// force only when a live change (SetPolicies) replaced its own: a
	// process started with the old policies during a rolling deploy.
	Adopt bool
	// Adapt lets the upstream's refusals (Feedback with a refused signal,
	// as package transport sends; not an outage's 503) lower the rate in
	// force for every process, and lets it climb back while the upstream
	// stays quiet. A refusal whose exhausted quotas say the upstream's
	// rate (Limit over Window; for an until-full quota, as OpenAI's and
	// Anthropic's, Limit − Remaining − 1 over Reset, never above the
	// upstream's rate) slows every policy's refills straight to the share
	// of its configured rate that this rate is of the rate of the policy
	// the quota steers, or leaves them when the rate in force is already
	// within it (the refusal was not for the rate); a refusal that says
	// no rate multiplies every refill rate by 0.85. Refusals within a
	// second of a step down count once; the rate is never below 1/16 of
	// the configured rate, never above it. Such a refusal's Retry-After
	// in whole seconds holds only until its exhausted quotas say a request
	// is back (at an until-full quota of calls, the time one of Limit
	// comes back; else its Reset), when they say so within the
	// Retry-After's last second. From 2 s after a step down, each second
	// the rate climbs fast (half the way, at least 1 % of the configured
	// rate) to 95 % of the rate last refused, then by 1 % of the
	// configured rate a step (5 % once the last refusal is 30 s old), up
	// to the configured rate (from a rate the upstream said, without the
	// fast part). Steps up are tried by this process's Enter and Feedback
	// calls. The slowed policies are stored in Redis as a live change
	// (SetPolicies with AsIs), which every process follows; SetPolicies ends
	// the adaptation. See docs/upstream.md.
	Adapt bool
	// ReplicaAcks, when above 0, closes the gap a failover leaves
	// (docs/guarantees.md, "Failover"): a caller learns its grant only
	// once that many replicas acknowledged its writes (WAIT after the
	// script, on the same connection), or else fails with
	// ErrNotReplicated. It costs a replica round trip per arrival and per
	// poll, and needs a client of one master (*redis.Client, which
	// redis.NewFailoverClient returns): New refuses it with others. 0
	// means off.
	ReplicaAcks int
	// ReplicaTimeout bounds each wait for ReplicaAcks. 0 means 100 ms.
	ReplicaTimeout time.Duration
	// Observer, when set, is told of every call to enter once it returns
	// (sluice.Observer): the metrics packages implement it. nil costs
	// nothing.
	Observer sluice.Observer
	// Logger, when set, receives what an operator must know: a scheduler
	// fenced by another process, the push lane turned off, this process
	// following a live change or refusing the policies in force. nil logs
	// nothing.
	Logger *slog.Logger
	// MaxLateness is how late after its slot a caller may still start. A
	// caller that wakes later (its process was frozen or starved of CPU)
	// does not start on its stale slot, which would bunch starts together
	// at the upstream: it keeps its place. When its token stayed unused in
	// a bucket that never filled since (always at saturation), it starts
	// at once with it, its grant moved to that instant; else the token is
	// spent and it takes the bucket's next slot, ahead of the callers
	// queued (Report.Retimes counts both). Lateness is judged
	// conservatively, from when the request left less the shortest round
	// trip seen, so round trips to Redis that vary by more than MaxLateness
	// make callers late: set it above that spread. 0 means 25 ms; negative
	// means a caller always starts on its slot, however late; between 0
	// and 1 ms is refused (no caller wakes that precisely).
	MaxLateness time.Duration
	// ReservationTTL is how long after its grant a Reservation may be
	// settled or cancelled (Reserve); past it, it counts at its estimate
	// for good and Settle and Cancel fail with ErrReservationSettled. 0
	// means 1 hour.
	ReservationTTL time.Duration
	// Fallback says what Enter does while Redis cannot be reached. The
	// zero value fails the call (within Enter's bound); LocalShare admits
	// callers from a limiter in this process at its share of the limit
	// until Redis answers again. See docs/guarantees.md, "When Redis is
	// unreachable", for when to choose which.
	Fallback Fallback
	// Shadow runs the bucket in shadow mode, to see what it would do to
	// live traffic before it does it: every call (Enter, EnterN,
	// EnterCost, Do, Reserve, TryEnter) returns at once as if granted,
	// whatever the limit and whether Redis answers, and what the limiter
	// would have done is recorded when Redis answers: the wait each call
	// would have had, or that it would have been refused (its ctx's
	// deadline or MaxWait shorter than that wait), in Stats (Shadow,
	// ShadowWait, ...), the Observer (Event.Shadow; the metrics packages'
	// sluice.shadow_wait) and EnterReport's Report.Shadow (EnterReport
	// alone waits the round trip to report it). A cost no policy counts
	// or above a Capacity is still an error. The shadow's state lives
	// apart from the bucket's ("<KeyPrefix>:shadow:{<Name>}:..."), so
	// shadow callers never slow the real callers of the same bucket; it
	// counts the shadow callers of every process, each given its turn at
	// once in arrival order as if none ever gave up: the wait recorded is
	// Enter's had every shadow call waited. MaxQueue and Fallback do not
	// apply. See docs/shadow.md.
	Shadow bool
}

// Fallback is what a Bucket does while Redis cannot be reached
// (Config.Fallback). The zero value fails the call.
type Fallback int

// LocalShare keeps admitting while Redis cannot be reached (refuses
// connections, or leaves a PING unanswered for 200 ms): each process
// admits from a limiter of its own at its share of every policy (the
// capacity and the refill divided by the processes that used the bucket
// within the last 5 s), first come first served, callers queued in Redis
// at the switch first, in their order. At Redis's first answer the
// process charges Redis with what its share granted and has not yet
// refilled, and returns to it: a bucket that Redis lost (an empty
// restart) starts from what the fleet granted locally, not full. A
// process that has not reached Redis since it started knows no share and
// fails as without a fallback. Token buckets only: New refuses it with a
// window (Fixed, Rolling).
const LocalShare Fallback = 1

// grace is how long keys outlive what they describe, and how long an
// uncollected slot is kept: long enough for a caller that polls late to
// still learn that its slot went stale.
func grace(cfg Config) time.Duration {
	return max(10*time.Second, 10*cfg.LockTTL)
}

func (c Config) withDefaults() (Config, error) {
	bad := func(format string, a ...any) (Config, error) {
		return c, configerr.Invalid(errConfig, format, a...)
	}
	if c.Name == "" {
		return bad("empty Name")
	}
	if c.Capacity != 0 || c.RefillAmount != 0 || c.RefillFrequency != 0 || len(c.Policies) == 0 {
		if err := checkPolicy(Policy{Capacity: c.Capacity, RefillAmount: c.RefillAmount, RefillFrequency: c.RefillFrequency}, ""); err != nil {
			return c, err
		}
	}
	c.Policies = slices.Clone(c.Policies)
	for i, p := range c.Policies {
		if err := checkPolicy(p, fmt.Sprintf("Policies[%d] ", i)); err != nil {
			return c, err
		}
	}
	if c.KeyPrefix == "" {
		c.KeyPrefix = rediskey.DefaultPrefix
	}
	if err := rediskey.CheckPrefix(errConfig, c.KeyPrefix); err != nil {
		return c, err
	}
	switch {
	case c.LockTTL == 0:
		c.LockTTL = defaultLockTTL
	case c.LockTTL < 10*time.Millisecond:
		return bad("LockTTL %v, want 0 (default) or ≥ 10ms", c.LockTTL)
	}
	switch {
	case c.Lookahead == 0:
		c.Lookahead = min(c.defaultLookahead(), c.LockTTL/2)
	case c.Lookahead < time.Millisecond || c.Lookahead > c.LockTTL/2:
		return bad("Lookahead %v, want 0 (default) or between 1ms and LockTTL/2 (%v)", c.Lookahead, c.LockTTL/2)
	}
	if err := windows(c.Policies, c.Lookahead, "Policies"); err != nil {
		return c, err
	}
	if err := c.checkQueueing(); err != nil {
		return c, err
	}
	if c.MaxWait < 0 || c.MaxWait > 0 && c.MaxWait < time.Microsecond {
		return bad("MaxWait %v, want 0 (unbounded) or ≥ 1µs (waits count whole microseconds)", c.MaxWait)
	}
	switch {
	case c.MaxLateness == 0:
		c.MaxLateness = defaultMaxLateness
	case c.MaxLateness > 0 && c.MaxLateness < minMaxLateness:
		return bad("MaxLateness %v, want 0 (default %v), negative (start however late) or ≥ %v: a caller wakes that late after its slot on any host, so every one would miss its slot and keep its place until its ctx ended", c.MaxLateness, defaultMaxLateness, minMaxLateness)
	}
	switch {
	case c.ReservationTTL < 0:
		return bad("ReservationTTL %v, want ≥ 0", c.ReservationTTL)
	case c.ReservationTTL == 0:
		c.ReservationTTL = time.Hour
	}
	return c.withReplicasAndFallback()
}

// withReplicasAndFallback is the end of withDefaults: ReplicaAcks,
// ReplicaTimeout and Fallback.
func (c Config) withReplicasAndFallback() (Config, error) {
	bad := func(format string, a ...any) (Config, error) {
		return c, configerr.Invalid(errConfig, format, a...)
	}
	switch {
	case c.ReplicaAcks < 0:
		return bad("ReplicaAcks %d, want ≥ 0", c.ReplicaAcks)
	case c.ReplicaTimeout < 0:
		return bad("ReplicaTimeout %v, want ≥ 0", c.ReplicaTimeout)
	case c.ReplicaTimeout == 0:
		c.ReplicaTimeout = 100 * time.Millisecond
	case c.ReplicaTimeout < time.Millisecond:
		return bad("ReplicaTimeout %v, want 0 (default) or ≥ 1ms (WAIT counts whole milliseconds)", c.ReplicaTimeout)
	}
	switch {
	case c.Fallback != 0 && c.Fallback != LocalShare:
		return bad("Fallback %d, want 0 (fail while Redis is unreachable) or LocalShare", c.Fallback)
	case c.Fallback == LocalShare:
		for i, p := range c.Policies {
			if p.Kind != TokenBucket {
				return bad("Fallback LocalShare with Policies[%d] a %v: the local share serves token buckets only (a window's grants cannot be divided between processes and charged back)", i, p.Kind)
			}
		}
	}
	for i, p := range c.Policies {
		if c.Shadow && p.Kind != TokenBucket {
			return bad("Shadow with Policies[%d] a %v: a shadow gives each caller its slot on arrival however far ahead, which only a token bucket tells exactly", i, p.Kind)
		}
	}
	return c, nil
}

// checkPolicy validates one policy; where prefixes its fields' names.
func checkPolicy(p Policy, where string) error {
	bad := func(format string, a ...any) error {
		return configerr.Invalid(errConfig, where+format, a...)
	}
	const maxCount = 1 << 40 // Lua numbers are doubles: keep every sum exact
	if p.Kind != TokenBucket {
		switch {
		case p.Kind != FixedWindow && p.Kind != RollingWindow:
			return bad("Kind %d, want TokenBucket, FixedWindow or RollingWindow", p.Kind)
		case p.RefillAmount != p.Capacity && p.RefillAmount != 0:
			return bad("RefillAmount %d of a window, want 0 or its Capacity %d (make one with Fixed or Rolling)", p.RefillAmount, p.Capacity)
		}
		p.RefillAmount = p.Capacity
	}
	switch {
	case p.Capacity < 1:
		return bad("Capacity %d, want ≥ 1 (with Rate(n, period, burst): the burst)", p.Capacity)
	case p.RefillAmount < 1:
		return bad("RefillAmount %d, want ≥ 1 (with Rate(n, period, burst): n)", p.RefillAmount)
	case p.RefillFrequency < time.Microsecond:
		return bad("RefillFrequency %v, want ≥ 1µs (with Rate(n, period, burst): the period)", p.RefillFrequency)
	case p.RefillFrequency%time.Microsecond != 0:
		return bad("RefillFrequency %v is not a whole number of microseconds (with Rate(n, period, burst): the period)", p.RefillFrequency)
	case p.RefillAmount > p.Capacity:
		r := Rate(p.RefillAmount, p.RefillFrequency, p.Capacity)
		return bad("RefillAmount %d above Capacity %d: tokens beyond Capacity are never usable; for %d per %v with a burst of %d, refill %d every %v (bucket.Rate(%d, %v, %d) says so)",
			p.RefillAmount, p.Capacity, p.RefillAmount, p.RefillFrequency, p.Capacity, r.RefillAmount, r.RefillFrequency, p.RefillAmount, p.RefillFrequency, p.Capacity)
	case p.Capacity > maxCount:
		return bad("Capacity %d above %d", p.Capacity, maxCount)
	case p.RefillFrequency > 100*365*24*time.Hour:
		return bad("RefillFrequency %v above 100 years", p.RefillFrequency)
	case strings.ContainsAny(p.Unit, ","):
		return bad("Unit %q contains a comma", p.Unit)
	}
	return nil
}

// unitName is how errors name a unit.
func unitName(u string) string {
	if u == "" {
		return "calls"
	}
	return fmt.Sprintf("%q", u)
}

// describe is a policy as errors show it: "1000 pu, 1 every 60ms",
// "20 calls in any 1s", "5000 calls each 1h0m0s".
func describe(p Policy) string {
	switch p.Kind {
	case RollingWindow:
		return fmt.Sprintf("%d %s in any %v", p.Capacity, unitName(p.Unit), p.RefillFrequency)
	case FixedWindow:
		return fmt.Sprintf("%d %s each %v", p.Capacity, unitName(p.Unit), p.RefillFrequency)
	}
	return fmt.Sprintf("%d %s, %d every %v", p.Capacity, unitName(p.Unit), p.RefillAmount, p.RefillFrequency)
}

// windows fills in the RefillAmount of windows (0 means Capacity) and
// checks that a rolling window is longer than the lookahead: slots are
// handed out that far ahead, and a rolling window's estimates past its
// log are lower bounds only as long as a window is longer.
func windows(ps []Policy, lookahead time.Duration, where string) error {
	for i := range ps {
		p := &ps[i]
		if p.Kind == TokenBucket {
			continue
		}
		p.RefillAmount = p.Capacity
		if p.Kind == RollingWindow && p.RefillFrequency <= lookahead {
			return configerr.Invalid(errConfig, "%s[%d]: a rolling window of %v, want one longer than Lookahead (%v)", where, i, p.RefillFrequency, lookahead)
		}
	}
	return nil
}

// checkQueueing checks MaxQueue and Lanes, and keeps the lanes by name.
func (c *Config) checkQueueing() (err error) {
	if c.MaxQueue < 0 {
		return configerr.Invalid(errConfig, "MaxQueue %d, want ≥ 0", c.MaxQueue)
	}
	c.lanes, err = lane.Check(errConfig, c.Lanes)
	return err
}
