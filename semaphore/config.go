package semaphore

import (
	"log/slog"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/configerr"
	"github.com/sluicehq/sluice/internal/lane"
	"github.com/sluicehq/sluice/internal/rediskey"
)

// Defaults for the optional Config fields.
const (
	DefaultLeaseTTL = 10 * time.Second
	DefaultQueueTTL = 2 * time.Second
)

// Bounds on the TTLs: below minTTL the renewals (every third of a TTL) would
// flood Redis, above maxTTL a crashed holder would block its place for days.
const (
	minTTL = 10 * time.Millisecond
	maxTTL = 24 * time.Hour
)

// Config describes a semaphore. Name and Capacity are required; the zero
// value of every other field picks its default. Every process sharing a
// semaphore must use the same Name and KeyPrefix; the Capacity in force is
// the one stored in Redis (see Capacity and Adopt).
type Config struct {
	// Name identifies the semaphore. Any non-empty byte string is valid,
	// including ones with '{', '}', '%' or ':'; different names never share
	// keys.
	Name string

	// Capacity is the most weight held at any instant, across all
	// processes: the number of permits when each weighs 1 (Acquire). It
	// must be at least 1.
	//
	// The capacity in force is stored in Redis with the semaphore's state.
	// When none is stored, the first process to reach Redis stores its
	// own. A process whose Capacity differs from the one in force gets
	// sluice.ErrConfigMismatch from its first Acquire (New does no I/O), unless
	// Adopt is set. Once a process has acquired under the capacity in
	// force, it follows later changes of it (SetCapacity) without error.
	Capacity int

	// Adopt makes this process follow the capacity in force in Redis when
	// it differs from Capacity, instead of failing with sluice.ErrConfigMismatch:
	// for processes that should enforce whatever limit is in force (set
	// by the first process or by SetCapacity) rather than their own.
	// Capacity is then used only when none is stored. False means a
	// Capacity that differs from the one in force is an error.
	Adopt bool

	// LeaseTTL is how long a permit stays valid without renewal. A
	// background goroutine renews held permits every LeaseTTL/3 (or
	// QueueTTL/3 if shorter), so a holder whose process dies frees its
	// place within LeaseTTL. Zero means DefaultLeaseTTL; otherwise it must
	// be between 10ms and 24h.
	LeaseTTL time.Duration

	// QueueTTL is how long a waiter keeps its place in the queue without
	// refreshing it. A waiter whose process dies leaves the queue within
	// QueueTTL, and a place granted to it returns within QueueTTL. Zero
	// means DefaultQueueTTL; otherwise between 10ms and 24h.
	QueueTTL time.Duration

	// MaxQueue bounds the number of waiters across all processes, in each
	// lane (WithLane); an Acquire that would exceed it fails with
	// sluice.ErrQueueFull. Zero means no bound.
	MaxQueue int

	// Lanes lists the lanes whose waiters are served differently from the
	// default (WithLane): by weight, counted in permits, and by priority
	// (sluice.Lane). A lane not listed has weight 1 and priority 0, as the
	// waiters that name none. Every process should list the same lanes:
	// each waiter carries its own process's weight and priority. New
	// refuses a name that is empty, over 128 bytes or holds a space, a
	// control character or '|', a name listed twice, and a negative
	// Weight or Priority (or one above 1,000,000 or 1000). nil: every
	// lane named is of weight 1 and priority 0.
	Lanes []sluice.Lane

	// KeyPrefix starts every key, "<KeyPrefix>:{<name>}:<suffix>". Empty
	// means "sluice". It must not contain '{' or '}'.
	KeyPrefix string

	// Observer, when set, is told of every Acquire and AcquireN (and Do's
	// Acquire) once it returns, as a sluice.Event of Limiter "semaphore"
	// and Name Name: the metrics packages implement it. It runs on the
	// caller's goroutine. nil costs nothing.
	Observer sluice.Observer

	// Logger, when set, receives what an operator must know: a permit's
	// lease lost while held, this process's Capacity refused because
	// another is in force, state in a format this code cannot read, this
	// process following a capacity changed in Redis (or changing it with
	// SetCapacity), and Redis becoming unreachable and reachable again
	// (with Fallback: this process switching to its local share, with the
	// share, and back).
	// nil logs nothing.
	Logger *slog.Logger

	// Fallback says what Acquire does while Redis cannot be reached. The
	// zero value fails the call, within Acquire's bound; LocalShare
	// admits callers from this process's share of Capacity until Redis
	// answers again. Choose LocalShare when running with somewhat more or
	// less than Capacity for a while is better than running nothing (a
	// pool of connections to a database that survives a few more); keep
	// the zero value when Capacity protects something that must never see
	// more (a licence count, a single writer). Any other value is refused
	// by New. See docs/semaphore.md, "When Redis is unreachable".
	Fallback Fallback

	lanes map[string]lane.Spec // Lanes by name (withDefaults)
}

// Fallback is what a Semaphore does while Redis cannot be reached
// (Config.Fallback). The zero value fails the call.
type Fallback int

// LocalShare keeps admitting while Redis cannot be reached (it refuses
// connections, or leaves a PING unanswered for 200 ms): within that bound
// each process switches to a limiter of its own that admits up to
// its share of the capacity, max(1, ⌊Capacity / n⌋) of weight held, where
// n is the number of processes that used the semaphore within the 5 s
// before (each traces itself in Redis once a second while it has callers).
// Callers queued in Redis at the switch are served first, in their
// order, then new ones, first come first served; the permits this
// process held at the switch stay held and count against its share.
//
// When Redis answers again the process registers in Redis every permit
// it holds (an empty restart starts from them, not from zero), then
// keeps its waiters back for 200 ms, while every other process notices
// Redis is back and registers its own, before sending them to Redis: the
// capacity is not exceeded at the return. A process that has not reached
// Redis since it started knows no share and fails as without a fallback.
//
// Across the fleet the shares sum to at most Capacity, except that with
// more processes than Capacity each still gets 1, and that a process
// holding more than its share at the switch keeps it until released.
const LocalShare Fallback = 1

// withDefaults validates c and fills in the defaults.
func (c Config) withDefaults() (Config, error) {
	if c.Name == "" {
		return c, configerr.Invalid(errConfig, "empty Name")
	}
	if c.Capacity < 1 {
		return c, configerr.Invalid(errConfig, "Capacity %d, want at least 1", c.Capacity)
	}
	if c.MaxQueue < 0 {
		return c, configerr.Invalid(errConfig, "MaxQueue %d, want 0 (no bound) or more", c.MaxQueue)
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.QueueTTL == 0 {
		c.QueueTTL = DefaultQueueTTL
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"LeaseTTL", c.LeaseTTL}, {"QueueTTL", c.QueueTTL}} {
		if d.v < minTTL || d.v > maxTTL {
			return c, configerr.Invalid(errConfig, "%s %v, want 0 (default) or between %v and %v", d.name, d.v, minTTL, maxTTL)
		}
	}
	var err error
	if c.lanes, err = lane.Check(errConfig, c.Lanes); err != nil {
		return c, err
	}
	if c.Fallback != 0 && c.Fallback != LocalShare {
		return c, configerr.Invalid(errConfig, "Fallback %d, want 0 (fail while Redis is unreachable) or LocalShare", c.Fallback)
	}
	if c.KeyPrefix == "" {
		c.KeyPrefix = rediskey.DefaultPrefix
	}
	return c, rediskey.CheckPrefix(errConfig, c.KeyPrefix)
}

// beat is the renewal and refresh period: a third of the shorter TTL, so
// two consecutive renewals can fail before a lease lapses.
func (c Config) beat() time.Duration {
	return min(c.LeaseTTL, c.QueueTTL) / 3
}
