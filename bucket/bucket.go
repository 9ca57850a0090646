// Package bucket is a distributed token bucket on Redis: every process that
// uses the same Name shares one quota, and callers start in their order of
// arrival at Redis, each at the moment its token is really there.
//
// A bucket holds at most Capacity tokens and gains RefillAmount tokens every
// RefillFrequency. The guarantee: in any window of length T, at most
// Capacity + RefillAmount × (⌊T / RefillFrequency⌋ + 1) callers are granted.
// A bucket may have several policies (Config.Policies), each in a unit
// (calls, processing units, tokens, bytes) and each with this guarantee
// for the sum of the costs it granted; a caller's cost (EnterN, EnterCost)
// is taken from every policy at once, or from none.
//
// How Enter works: the caller's fresh ID arrives at Redis in one script.
// When nobody waits and a token is due within the lookahead, that is the
// whole story (one round trip). Otherwise the ID joins a Redis list and the
// caller sleeps the estimate of its wait that the script computed from its
// place in the list. Whichever process holds a short-lived lock runs the
// scheduler (package scheduler), which pops IDs in arrival order and writes
// each one's slot (package queue); the caller wakes, polls once, finds its
// slot and sleeps until it. Redis TIME is the only clock. See docs/design.md.
//
// The limit lives in Redis: the first process stores its policies, every
// process enforces the ones stored, and a process whose policies differ
// fails with sluice.ErrConfigMismatch (or follows them: Config.Adopt). SetPolicies
// changes them for every process at once, re-timing the callers queued;
// Policies reads them. See docs/limits.md.
//
// The upstream has the last word: Feedback (an upstream.Receiver, which
// package transport calls after every response), Hold and Sync apply its
// Retry-After and "remaining" counters to every process at once, and
// Config.Adapt lets its refusals lower the rate. See docs/upstream.md.
//
// Seeing what it does: Stats (this process, no I/O), Inspect (every
// process, one round trip), Config.Observer (each call, for metrics) and
// Config.Logger. See docs/observability.md.
package bucket

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/background"
	"github.com/sluicehq/sluice/internal/configerr"
	"github.com/sluicehq/sluice/internal/enterdetail"
	"github.com/sluicehq/sluice/internal/hub"
	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/internal/rediscall"
	"github.com/sluicehq/sluice/internal/verdict"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/scheduler"
)

// Errors. Refusals (matching sluice.ErrQueueFull or sluice.ErrWaitTooLong)
// consume nothing and match sluice.ErrLimited; calls after Close match
// sluice.ErrClosed; a refused configuration, sluice.ErrConfig. A cost above a
// policy's Capacity can never be granted: it is refused at once with an
// error matching sluice.ErrCostExceedsCapacity, not sluice.ErrLimited. A
// process whose policies are not the ones in force in Redis (see
// Config.Adopt) gets a *sluice.ConfigMismatchError naming both, which
// matches sluice.ErrConfigMismatch and sluice.ErrConfig. A failed call to
// Redis returns an error that matches both ctx.Err() (when the caller's ctx
// ended) and Redis's own error.
var (
	errClosed      = configerr.Kind("bucket", sluice.ErrClosed)
	errQueueFull   = configerr.Kind("bucket", sluice.ErrQueueFull)
	errWaitTooLong = configerr.Kind("bucket", sluice.ErrWaitTooLong)
	errConfig      = configerr.New("bucket")
	// ErrNotReplicated: with Config.ReplicaAcks, the writes of the
	// caller's grant were not acknowledged by that many replicas in time.
	// The caller must not start; its token is spent.
	ErrNotReplicated = errors.New("bucket: grant not acknowledged by the replicas")
)

// errCostExceedsCapacity is wrapped by the refusal of a cost above a
// policy's Capacity.
var errCostExceedsCapacity = configerr.Kind("bucket", sluice.ErrCostExceedsCapacity)

// Bucket is a handle on a shared bucket. It is safe for concurrent use by
// any number of goroutines.
type Bucket struct {
	cfg      Config
	rdb      redis.UniversalClient
	policies []Policy // this process's own: the pinned policy (if any), then cfg.Policies
	ownID    string   // their id in Redis (protocol.Config)
	q        *queue.Queue
	keys     queueio.Keys   // q's
	reads    queueio.Client // q's client, for the plain reads of keys (queueio.ReadConfig, Inspect)
	sched    *scheduler.Scheduler
	lead     time.Duration // wake this long before the estimated slot to poll
	// hub is what every bucket and semaphore on rdb shares: the Pub/Sub
	// connection, the precise timer and the loop the scheduler runs on.
	hub *hub.Hub
	// bg owns the Bucket's own goroutines: its batchers' flushers, which
	// run only while callers' arrivals or cancels are pending. Close ends
	// them.
	bg      *background.Group
	comings comings // arrivals and cancels, batched
	notices notices // slots the scheduler tells on the wake channel
	// queued counts this process's callers queued in Redis, from their
	// arrival until they learn their slot: the scheduler keeps the lock
	// only while there are some (scheduler.New's waiting).
	queued atomic.Int64
	// others is when (local clock, unix ns) a reply last showed callers
	// of other handles waiting in this bucket, whose processes may stop
	// (a claim, a swap, a slot taken, a slot written for a late caller):
	// a late caller here then has a queued one poll to take what theirs
	// leave (notices.poke).
	others atomic.Int64
	// watching: the process's stop watch calls this bucket's onTick
	// (sawOthers starts it; onTick ends it).
	watching atomic.Bool
	// now is the local clock, used only to measure durations: nothing read
	// from it is ever compared with Redis time. Tests skew it.
	now func() time.Time
	rtt roundTrip
	// back is the queue's back as this process last learned it: a caller
	// it already passes the deadline of is refused without a round trip.
	back back
	// tally counts the calls for Stats and tells the Observer.
	tally verdict.Tally
	// syncs throttles Feedback's syncs (feedback.go).
	syncs syncClock
	// adapting: the policies in force are slowed by Adapt; adaptTried
	// (unix ns, local clock) is this process's last try of a step up.
	adapting   atomic.Bool
	adaptTried atomic.Int64
	// IDs are a random UUID drawn once per Bucket and a counter: fresh for
	// every arrival, unique across processes, and far cheaper than a
	// crypto-random UUID per Enter (which cost a third of the CPU of a
	// burst of 1000 Enters).
	idPrefix string
	idSeq    atomic.Uint64
	// fb is the fallback while Redis is away (fallback.go).
	fb fallback
	// shadow runs the calls of a bucket in shadow mode (Config.Shadow;
	// nil: not).
	shadow *shadow

	closeOnce sync.Once
}

// newID returns a caller ID never used before by any Bucket.
func (b *Bucket) newID() string {
	return b.idPrefix + strconv.FormatUint(b.idSeq.Add(1), 36)
}

// New validates cfg and rdb and returns a Bucket. It does no I/O (a Redis
// that is down shows at the first Enter) and starts no goroutine until a
// caller has to wait. Make as many Buckets on one client as you have
// quotas: every Bucket and Semaphore on a client shares one Pub/Sub
// connection, one pipelining of their calls to Redis and one scheduler
// loop, and an idle one costs no goroutine, connection or command. Close
// each when done; the shared part ends with the last one on the client. rdb must have ContextTimeoutEnabled set (see
// redis.Options), or New refuses it: go-redis would otherwise ignore
// deadlines shorter than its read timeout, and a caller's deadline would
// not hold while Redis is slow.
func New(rdb redis.UniversalClient, cfg Config) (*Bucket, error) {
	if err := rediscall.CheckClient(errConfig, rdb); err != nil {
		return nil, err
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if _, ok := rdb.(*redis.Client); cfg.ReplicaAcks > 0 && !ok {
		return nil, configerr.Invalid(errConfig, "ReplicaAcks %d needs a client of one master (*redis.Client, as redis.NewClient and redis.NewFailoverClient return), not %T: WAIT must follow the grant on its connection", cfg.ReplicaAcks, rdb)
	}
	policies := cfg.Policies
	if cfg.Capacity != 0 {
		policies = append([]Policy{{Capacity: cfg.Capacity, RefillAmount: cfg.RefillAmount, RefillFrequency: cfg.RefillFrequency}}, policies...)
	}
	qps := toQueue(policies)
	h := hub.Acquire(rdb)
	// Script calls share round trips with every other handle's on rdb;
	// not with ReplicaAcks, whose WAIT would hold up everyone's.
	var qc queueio.Client = h.Pipelining()
	if cfg.ReplicaAcks > 0 {
		qc = rdb
	}
	keys := queueio.NewKeys(shadowPrefix(cfg), cfg.Name)
	q := queue.New(qc, queueOptions(cfg, keys, qps))
	bg := background.NewGroup()
	b := &Bucket{
		cfg:      cfg,
		rdb:      rdb,
		policies: policies,
		ownID:    protocol.Config{Policies: qps}.ID(),
		q:        q,
		keys:     keys,
		reads:    qc,
		lead:     cfg.Lookahead / 4,
		hub:      h,
		bg:       bg,
		notices:  notices{hub: h, channel: keys.Wake},
		now:      time.Now,
	}
	b.sched = scheduler.New(rdb, q, func() bool { return b.queued.Load() > 0 })
	b.notices.handover = func() {
		if b.queued.Load() > 0 {
			b.sched.Ensure()
		}
	}
	b.tally.Limiter, b.tally.Name, b.tally.Observer = "bucket", cfg.Name, cfg.Observer
	b.comings.init(bg, q, batchTimeout, cfg.LockTTL, func() time.Time { return b.now() })
	b.comings.learn = b.learnBack
	b.notices.changed = b.changed
	u := uuid.New()
	b.idPrefix = base64.RawURLEncoding.EncodeToString(u[:]) + "."
	b.fb = noFallback{b}
	if cfg.Fallback == LocalShare {
		b.fb = newLocalShare(b)
	}
	b.shadow = newShadow(b) // nil unless cfg.Shadow
	return b, nil
}

// queueOptions are the options of the queue of a Bucket of cfg whose
// keys are keys and policies qps (New).
func queueOptions(cfg Config, keys queueio.Keys, qps []protocol.Policy) queueio.Options {
	return queueio.Options{
		Keys:           keys,
		Policies:       qps,
		Lookahead:      shadowLookahead(cfg),
		LockTTL:        cfg.LockTTL,
		Grace:          grace(cfg),
		MaxLateness:    cfg.MaxLateness,
		Lead:           cfg.Lookahead / 4,
		MaxQueue:       cfg.MaxQueue,
		MaxWait:        cfg.MaxWait,
		Replicas:       cfg.ReplicaAcks,
		ReplicaTimeout: cfg.ReplicaTimeout,
		Logger:         cfg.Logger,
	}
}

// Config returns this process's configuration with defaults filled in.
// Its policies are the ones this process started with; Policies reads the
// ones in force, which this process may follow instead (SetPolicies, Adopt).
func (b *Bucket) Config() Config {
	c := b.cfg
	c.Policies = slices.Clone(c.Policies) // the caller's to change
	return c
}

// Stats are this process's figures for one Bucket (sluice.Stats): callers
// waiting now, the results of its calls and re-entries since New, and its
// scheduler's steps, fenced steps and errors. Inspect reads the bucket's
// figures across every process.
type Stats = sluice.Stats

// Stats returns this process's figures. It does no I/O.
func (b *Bucket) Stats() Stats {
	s := b.tally.Stats()
	s.Steps, s.Fenced, s.Errors = b.sched.Stats()
	s.Local, _, _ = b.fb.state()
	return s
}

// Close stops this process's goroutines for the bucket, waits for them and
// hands the scheduler lock over if this process held it (the other
// processes' callers take it at once); callers still waiting in Enter
// return sluice.ErrClosed, and cancels not yet sent are sent first. Other
// processes, and other handles on the same client, go on using theirs.
// Close is safe to call more than once; it always returns nil (the
// signature is io.Closer's).
func (b *Bucket) Close() error {
	b.closeOnce.Do(func() {
		b.bg.Close()
		b.notices.close()
		b.sched.Close()
		b.hub.Release()
	})
	return nil
}

// Do enters the bucket, then runs fn. It returns Enter's error, or else fn's.
func (b *Bucket) Do(ctx context.Context, fn func(ctx context.Context) error) error {
	if err := b.Enter(ctx); err != nil {
		return err
	}
	return fn(ctx)
}

var _ sluice.RateLimiter = (*Bucket)(nil)

// reasons are the bucket's errors as Events name them.
var reasons = []verdict.Reason{
	{Err: errQueueFull, Result: sluice.Refused, Name: "queue_full"},
	{Err: errWaitTooLong, Result: sluice.Refused, Name: "wait_too_long"},
	{Err: ErrNotReplicated, Result: sluice.Failed, Name: "not_replicated"},
	{Err: errClosed, Result: sluice.Failed, Name: "closed"},
}

// Enter returns when the caller may start one unit of work, in its turn.
// It returns an error matching ctx.Err() when ctx ends first, sluice.ErrQueueFull
// or sluice.ErrWaitTooLong when refused, sluice.ErrClosed after Close, or a Redis error.
//
// Deadlines: as x/time/rate's Wait, Enter refuses at once a wait its
// ctx's deadline cannot cover. A caller whose turn is estimated after its
// deadline (the estimate counts the callers queued ahead of it, so it is
// the earliest it could start while they stay) returns at once with a
// *sluice.WaitTooLongError that carries the estimate and matches both
// sluice.ErrWaitTooLong and context.DeadlineExceeded; it took no place and
// no token. The same holds while it waits: when a later poll finds its
// turn past the deadline, it leaves then, not at the deadline. For 100 ms
// after a reply told this process that the queue's back is past such a
// caller's deadline, the caller is refused without asking Redis (unless
// a caller of this process has left since): leavers of other processes
// in those 100 ms are not counted.
//
// While Redis is unreachable (it refuses connections, or does not answer)
// Enter fails within 3 s whatever its ctx (plus 4 ×
// Config.ReplicaTimeout with ReplicaAcks), or at its ctx's deadline if that comes first: each
// call to Redis made for the caller gives up after 1 s without an answer
// (plus 4 × ReplicaTimeout) unless Redis still answers (a call this
// process made since got its reply, or a PING within 2 s: it is slow, or
// this process starved, not away; the call is made again), and a queued caller
// polls Redis at least once a second. The error says so in a person's words ("bucket \"api\": Redis
// at 127.0.0.1:6379 unreachable: connection refused") and matches the
// network's error (syscall.ECONNREFUSED); it matches ctx.Err() only when
// ctx ended first.
//
// Cancellation: a caller still in the queue leaves it and spends no token;
// one whose slot was already assigned (its token due within the lookahead)
// passes the slot to the next caller in line, who starts at that very
// instant, when the slot is still a little ahead (docs/design.md, "A place
// given up"); otherwise its token is spent, as is a slot given at arrival,
// with nobody queued.
func (b *Bucket) Enter(ctx context.Context) error {
	_, err := b.enter(ctx, nil)
	return err
}

// EnterN is Enter for a caller that costs n calls: n tokens of every policy
// counting calls (Unit ""), as x/time/rate's WaitN. n = 0 returns at once.
func (b *Bucket) EnterN(ctx context.Context, n int) error {
	return b.EnterCost(ctx, Cost{"": n})
}

// EnterCost is Enter for a caller of cost c, which is taken from every
// policy at once (each policy takes c[its Unit]) or from none. The caller
// waits its turn in arrival order whatever its cost: a large cost at the
// head of the queue waits for its tokens and those behind it wait too,
// never overtaking it. A nil c is Enter's cost (as for Reserve and
// Estimate); a cost that takes nothing (Cost{}, or only zeros) returns at
// once. A cost
// above a policy's Capacity is refused at once with sluice.ErrCostExceedsCapacity;
// a negative cost, or one in a unit no policy counts, is an error.
//
// Cancellation gives the whole cost back while the caller is still queued;
// once its slot was assigned (its tokens due within the lookahead) they
// pass on as Enter's do.
func (b *Bucket) EnterCost(ctx context.Context, c Cost) error {
	_, err := b.EnterReport(ctx, c)
	return err
}

// Report tells what one Enter did.
type Report struct {
	Ticket    int64         // arrival order at Redis among this bucket's callers (0: none)
	Position  int           // place in the queue at arrival (0: not queued)
	Wait      time.Duration // from the call to the return of Enter
	Late      time.Duration // how late after its slot Enter returned, at most (local clock, less the usual round trip)
	Reentries int           // times the caller entered again (its slot lost, or a live change)
	// Retimes counts the times the caller came later than MaxLateness
	// for its slot: it then started at once with the slot's tokens, when
	// they stayed unused in a bucket that never filled since, or took the
	// next slot, ahead of the callers queued (see docs/design.md,
	// "Overload").
	Retimes int
	// Local reports that the local share admitted the caller while Redis
	// could not be reached (Config.Fallback); Ticket and Position are
	// then those it had before, if any.
	Local bool
	// Shadow is, with Config.Shadow, what the limiter would have done
	// (the call itself returned at once).
	Shadow ShadowReport
}

// entered is what enter keeps of one caller: the Report it returns, and
// the figures only the bench and the tests read, which it copies to the
// enterdetail.Detail the ctx carries, if any.
type entered struct {
	Report
	enterdetail.Detail
}

// EnterReport is Enter that also reports what happened; with a cost, it
// is EnterCost (at most one cost).
func (b *Bucket) EnterReport(ctx context.Context, cost ...Cost) (Report, error) {
	if b.shadow != nil && len(cost) <= 1 {
		e, err := b.shadow.enter(ctx, append(cost, nil)[0], true)
		return e.Report, err
	}
	switch len(cost) {
	case 0:
		e, err := b.enter(ctx, nil)
		return e.Report, err
	case 1:
		e, err := b.enter(ctx, cost[0]) // nil: Enter's
		return e.Report, err
	}
	return Report{}, fmt.Errorf("bucket: EnterReport with %d costs, want at most one", len(cost))
}
