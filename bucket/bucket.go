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
	"net"
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
	errClosed      = fmt.Errorf("bucket: %w", sluice.ErrClosed)
	errQueueFull   = fmt.Errorf("bucket: %w", sluice.ErrQueueFull)
	errWaitTooLong = fmt.Errorf("bucket: %w", sluice.ErrWaitTooLong)
	errConfig      = configerr.New("bucket")
	// ErrNotReplicated: with Config.ReplicaAcks, the writes of the
	// caller's grant were not acknowledged by that many replicas in time.
	// The caller must not start; its token is spent.
	ErrNotReplicated = errors.New("bucket: grant not acknowledged by the replicas")
)

// errCostExceedsCapacity is wrapped by the refusal of a cost above a
// policy's Capacity.
var errCostExceedsCapacity = fmt.Errorf("bucket: %w", sluice.ErrCostExceedsCapacity)

// Bucket is a handle on a shared bucket. It is safe for concurrent use by
// any number of goroutines.
type Bucket struct {
	cfg      Config
	rdb      redis.UniversalClient
	policies []Policy // this process's own: the pinned policy (if any), then cfg.Policies
	ownID    string   // their id in Redis (queue.Config)
	q        *queue.Queue
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
	// only while there are some (scheduler.WhileWaiting).
	queued atomic.Int64
	// now is the local clock, used only to measure durations: nothing read
	// from it is ever compared with Redis time. Tests skew it.
	now func() time.Time
	rtt roundTrip
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
	// fb is the local share (fallback.go); nil without Config.Fallback.
	fb *fallback

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
	var qc queue.Client = h.Pipelining()
	if cfg.ReplicaAcks > 0 {
		qc = rdb
	}
	q := queue.New(qc, cfg.KeyPrefix, cfg.Name, queue.Options{
		Policies:       qps,
		Lookahead:      cfg.Lookahead,
		LockTTL:        cfg.LockTTL,
		Grace:          grace(cfg),
		MaxLateness:    cfg.MaxLateness,
		Lead:           cfg.Lookahead / 4,
		MaxQueue:       cfg.MaxQueue,
		MaxWait:        cfg.MaxWait,
		Replicas:       cfg.ReplicaAcks,
		ReplicaTimeout: cfg.ReplicaTimeout,
		Logger:         cfg.Logger,
	})
	bg := background.NewGroup()
	b := &Bucket{
		cfg:      cfg,
		rdb:      rdb,
		policies: policies,
		ownID:    queue.Config{Policies: qps}.ID(),
		q:        q,
		sched:    scheduler.New(rdb, q),
		lead:     cfg.Lookahead / 4,
		hub:      h,
		bg:       bg,
		notices:  notices{hub: h, channel: q.Keys().Wake},
		now:      time.Now,
	}
	b.sched.WhileWaiting(func() bool { return b.queued.Load() > 0 })
	b.notices.handover = func() {
		if b.queued.Load() > 0 {
			b.sched.Ensure()
		}
	}
	b.tally.Limiter, b.tally.Name, b.tally.Observer = "bucket", cfg.Name, cfg.Observer
	b.comings.init(bg, q, batchTimeout, cfg.LockTTL, func() time.Time { return b.now() })
	b.notices.changed = b.changed
	u := uuid.New()
	b.idPrefix = base64.RawURLEncoding.EncodeToString(u[:]) + "."
	if cfg.Fallback == LocalShare {
		b.fb = newFallback(b)
	}
	return b, nil
}

// Config returns this process's configuration with defaults filled in.
// Its policies are the ones this process started with; Policies reads the
// ones in force, which this process may follow instead (SetPolicies, Adopt).
func (b *Bucket) Config() Config { return b.cfg }

// Stats are this process's figures for one Bucket (sluice.Stats): callers
// waiting now, the results of its calls and re-entries since New, and its
// scheduler's steps, fenced steps and errors. Inspect reads the bucket's
// figures across every process.
type Stats = sluice.Stats

// Stats returns this process's figures. It does no I/O.
func (b *Bucket) Stats() Stats {
	s := b.tally.Stats()
	ss := b.sched.Stats()
	s.Steps, s.Fenced, s.Errors = ss.Steps, ss.Fenced, ss.Errors
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
// turn past the deadline, it leaves then, not at the deadline.
//
// While Redis is unreachable (it refuses connections, or does not answer)
// Enter fails within 3 s whatever its ctx (plus 4 ×
// Config.ReplicaTimeout with ReplicaAcks), or at its ctx's deadline if that comes first: each
// call to Redis made for the caller gives up after 1 s without an answer
// (plus 4 × ReplicaTimeout) unless Redis still answers a PING within 1 s
// (it is slow, not away: the call is made again), and a queued caller
// polls Redis at least once a second. The error says so in a person's words ("bucket \"api\": Redis
// at 127.0.0.1:6379 unreachable: connection refused") and matches the
// network's error (syscall.ECONNREFUSED); it matches ctx.Err() only when
// ctx ended first.
//
// Cancellation: a caller still in the queue leaves it and spends no token;
// one whose slot was already assigned (its token due within the lookahead)
// passes its token on: it goes back to the bucket, for the next caller in
// line, whenever that cannot exceed the limit (docs/design.md, "A place
// given up"). Only a slot given at arrival, with nobody queued, stays
// spent when its caller leaves.
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
// never overtaking it. A cost that takes nothing returns at once. A cost
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
	// for its slot and took the next one instead, ahead of the callers
	// queued (see docs/design.md, "Overload").
	Retimes int
	// Local reports that the local share admitted the caller while Redis
	// could not be reached (Config.Fallback); Ticket and Position are
	// then those it had before, if any.
	Local bool
}

// entered is what enter keeps of one caller: the Report it returns, and
// the figures only the bench and the tests read, which it copies to the
// enterdetail.Detail the ctx carries, if any.
type entered struct {
	Report
	enterdetail.Detail
}

// Estimate is what a caller would meet if it entered now.
type Estimate struct {
	Wait  time.Duration // until its slot: 0 if it would start at once
	Ahead int           // callers queued ahead of it, in every process
}

// Estimate says, without taking anything, how long a caller of cost c
// would wait if it entered now, counting the callers already queued in
// every process and their costs. The wait is exact unless callers ahead
// give up (then it is shorter) or the caller would be refused (MaxQueue,
// MaxWait). A cost is checked as EnterCost checks it. One round trip.
func (b *Bucket) Estimate(ctx context.Context, c Cost) (Estimate, error) {
	for settled := 0; ; settled++ {
		costs, _, err := b.costs(c)
		if err != nil {
			return Estimate{}, err
		}
		wait, ahead, err := b.q.Estimate(ctx, costs)
		retry, serr := b.followInForce(ctx, err, settled)
		switch {
		case retry:
			continue
		case serr != nil:
			return Estimate{}, serr
		case err != nil:
			return Estimate{}, b.redisErr(ctx, err)
		}
		return Estimate{Wait: wait, Ahead: ahead}, nil
	}
}

// EnterReport is Enter that also reports what happened; with a cost, it
// is EnterCost (at most one cost).
func (b *Bucket) EnterReport(ctx context.Context, cost ...Cost) (Report, error) {
	switch len(cost) {
	case 0:
		e, err := b.enter(ctx, nil)
		return e.Report, err
	case 1:
		if cost[0] == nil {
			cost[0] = Cost{}
		}
		e, err := b.enter(ctx, cost[0])
		return e.Report, err
	}
	return Report{}, fmt.Errorf("bucket: EnterReport with %d costs, want at most one", len(cost))
}

// enter enters a caller of cost c (nil: Enter's). Its costs per policy are
// taken anew for each arrival: a live change may have changed the
// policies in force meanwhile.
func (b *Bucket) enter(ctx context.Context, c Cost) (rep entered, err error) {
	start := b.now()
	b.tally.Begin()
	defer func() {
		res, why := verdict.Classify(ctx, err, reasons...)
		b.tally.End(sluice.Event{Result: res, Reason: why, Wait: b.now().Sub(start), Queued: rep.Position > 0 && res != sluice.Refused, Late: rep.Late, Reentries: rep.Reentries, Local: rep.Local})
		if d := enterdetail.From(ctx); d != nil {
			*d = rep.Detail
		}
	}()
	if b.fb != nil {
		defer b.fb.begin()()
	}
	limit := b.answerWithin()
	for settled := 0; ; {
		select {
		case <-b.bg.Done():
			return rep, errClosed
		default:
		}
		var costs []int64
		if c != nil {
			var zero bool
			var err error
			if costs, zero, err = b.costs(c); err != nil || zero {
				if err == nil {
					err = ctx.Err()
				}
				return rep, err
			}
		}
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		if b.fb != nil && b.fb.serving() {
			if err := b.fb.admit(ctx, "", costs, &rep.Report); err != errBack {
				rep.Wait = b.now().Sub(start)
				return rep, err
			}
		}
		again, err := b.enterOnce(ctx, costs, &rep, &limit)
		var gone goneLocal
		if errors.As(err, &gone) {
			if err = b.fb.admit(ctx, gone.entry, costs, &rep.Report); err == errBack {
				continue // back on Redis before this caller booked
			}
			rep.Wait = b.now().Sub(start)
			return rep, err
		}
		if retry, serr := b.followInForce(ctx, err, settled); retry {
			settled++
			continue
		} else if serr != nil {
			err = serr
		}
		if !again {
			rep.Wait = b.now().Sub(start)
			if err == nil && b.cfg.Adapt {
				b.maybeAdaptUp()
			}
			return rep, err
		}
		rep.Reentries++
	}
}

// enterOnce makes one arrival with a fresh ID. It reports again when the
// caller must arrive anew (its slot went stale or was lost).
//
// limit bounds each of its calls to Redis (rediscall.CallCtx): it doubles
// each time a call runs out of it while Redis answers a PING (busy), so
// that a slow Redis is waited for and a frozen one is not.
func (b *Bucket) enterOnce(ctx context.Context, costs []int64, rep *entered, limit *time.Duration) (again bool, err error) {
	id := b.newID()
	own := b.ownWait(ctx)
	cctx, done, within := rediscall.CallCtx(ctx, *limit)
	er, sent, err := b.comings.enqueue(cctx, id, costs, own)
	done()
	received := b.now()
	rep.RoundTrips++
	if errors.As(err, new(*queue.ConfigError)) {
		return false, err // nothing was written: settle it
	}
	if err != nil {
		if ctx.Err() != nil || errors.Is(cctx.Err(), context.DeadlineExceeded) || errors.Is(err, queue.ErrNotReplicated) {
			b.cancel(id) // it may have arrived before the caller gave up
		}
		if b.busy(ctx, cctx, within, err) {
			*limit = min(2**limit, time.Minute)
			return true, nil // arrive again
		}
		if b.fb != nil && b.fb.away(ctx, err) {
			return false, goneLocal{}
		}
		return false, b.callErr(ctx, err, within)
	}
	b.rtt.observe(received.Sub(sent)) // only replies: a failed call says nothing of the network
	rep.Ticket, rep.Position = er.Ticket, er.Position
	switch {
	case errors.Is(er.Err, queue.ErrQueueFull):
		return false, fmt.Errorf("%w (%d waiting)", errQueueFull, er.Position)
	case errors.Is(er.Err, queue.ErrWaitTooLong):
		return false, b.tooLong(er.Delay, own)
	case er.Entry == "": // its slot at once
		rep.Slot = time.UnixMicro(er.Slot)
		return b.sleepToSlot(ctx, sent, received, er.Delay, rep, costs, "", "")
	}
	if own > 0 && er.Delay > own {
		// Pushed (queue.Enqueue's push lane cannot refuse): leave at once.
		b.cancel(er.Entry)
		return false, b.tooLong(er.Delay, own)
	}
	// The first caller of this process to queue makes sure a scheduler
	// runs even when the reply says one does: it may be this process's,
	// handing the lock over because it had no caller queued (its last
	// step and this arrival crossed).
	if b.queued.Add(1) == 1 || !er.SchedulerRunning {
		b.sched.Ensure()
	}
	return b.awaitSlot(ctx, er, received, rep, costs, limit)
}

// awaitSlot sleeps until shortly before the estimated slot, then polls for
// the slot; a poll that finds none backs off and, when no scheduler holds the
// lock, starts one here. However far its slot, a caller polls at least
// every checkIn: that is how it learns that Redis is away (the poll fails)
// and fails within Enter's bound rather than at its slot. When the scheduler publishes the caller's slot
// (pushed callers always, others when the slot came earlier than their
// estimate), the caller polls a lead before that slot instead.
func (b *Bucket) awaitSlot(ctx context.Context, er queue.Arrival, enqueued time.Time, rep *entered, costs []int64, limit *time.Duration) (bool, error) {
	entry := er.Entry
	hints, forget := b.notices.register(entry)
	var switched <-chan struct{}
	unqueue := func() {}
	if b.fb != nil {
		switched, unqueue = b.fb.queue(entry, er.Ticket, costs)
	}
	keep := false // gone local: admit takes its booking, then forgets it
	gone := func() (bool, error) {
		b.cancel(entry)
		keep = true
		return false, goneLocal{entry}
	}
	dequeued := sync.OnceFunc(func() {
		if !keep {
			unqueue()
		}
		forget()
		if b.queued.Add(-1) == 0 {
			// The last caller of this process queued here learned its
			// slot, or gave up: the scheduler hands the lock over now
			// rather than at its next step.
			b.sched.Ensure()
		}
	})
	defer dequeued()
	// local places an instant of the Redis clock on this process's clock,
	// by the enqueue reply: Redis read its clock (er.Now) before the reply
	// was received (enqueued), so the result is late by at most the round
	// trip, against a lead of a quarter of the lookahead.
	local := func(us int64) time.Time { return enqueued.Add(time.Duration(us-er.Now) * time.Microsecond) }
	backoff := time.Millisecond
	wait := er.Delay - b.leadNow()
	for {
		var reach <-chan struct{}
		if b.fb != nil {
			_, reach = b.hub.Away()
		}
		slot, err := b.sleep(ctx, min(wait, checkIn), hints, switched, reach)
		if errors.Is(err, errReach) {
			if away, _ := b.hub.Away(); away && b.fb.goLocal() {
				return gone()
			}
			switched, _ = b.fb.queue(entry, er.Ticket, costs) // back on Redis meanwhile: the next switch's
			continue
		}
		if err != nil {
			b.cancel(entry)
			return false, err
		}
		if slot > 0 {
			// The scheduler gave the slot: poll a lead before it.
			if _, err := b.sleep(ctx, local(slot).Add(-b.leadNow()).Sub(b.now()), nil, switched, nil); errors.Is(err, errReach) {
				return gone()
			} else if err != nil {
				b.cancel(entry)
				return false, err
			}
		}
		cctx, done, within := rediscall.CallCtx(ctx, *limit)
		sentFn, pctx := sentAt(cctx, b.now)
		pr, err := b.q.Poll(pctx, entry)
		done()
		received := b.now()
		var sent time.Time
		if err == nil {
			sent = sentFn() // a failed call may still be stamping it
		}
		rep.Polls++
		rep.RoundTrips += max(pr.RoundTrips, 1)
		if errors.As(err, new(*queue.ConfigError)) {
			// A live change since this caller queued: poll under the
			// policies in force (the caller keeps its place).
			if _, serr := b.followInForce(ctx, err, 0); serr != nil {
				b.cancel(entry)
				return false, serr
			}
			wait = 0
			continue
		}
		if err != nil {
			if b.busy(ctx, cctx, within, err) {
				*limit = min(2**limit, time.Minute)
				wait = 0 // poll again
				continue
			}
			if b.fb != nil && b.fb.away(ctx, err) {
				return gone()
			}
			b.cancel(entry)
			return false, b.callErr(ctx, err, within)
		}
		b.rtt.observe(received.Sub(sent))
		own := b.ownWait(ctx)
		switch {
		case pr.Found && own > 0 && pr.Delay > own:
			// Its slot comes after its deadline: leave now, and pass
			// the slot on rather than sleep it out.
			dequeued()
			b.leave(queue.Leaver{Entry: entry, Room: pr.Room, Costs: costs})
			return false, b.tooLong(pr.Delay, own)
		case pr.Found:
			dequeued()
			rep.Slot = time.UnixMicro(pr.Slot)
			return b.sleepToSlot(ctx, sent, received, pr.Delay, rep, costs, entry, pr.Room)
		case pr.Stale:
			// The poll itself came too late for the slot: keep the place.
			dequeued()
			return b.retime(ctx, rep, costs, entry, pr.Room)
		case pr.Lost:
			return true, nil
		case own > 0 && pr.Delay > own:
			// Still queued, and its turn now estimated past its deadline
			// (callers ahead took longer, or late ones took slots first).
			b.cancel(entry)
			return false, b.tooLong(pr.Delay, own)
		}
		rep.Position = pr.Position
		if pr.LockTTL < 0 {
			b.sched.Ensure()
		}
		// Far from its slot (callers ahead cancelled, or the caller woke
		// early): trust the new estimate. At or past it: the scheduler is
		// late or dead; back off, but never beyond the moment its lock
		// expires, when this caller may take over.
		wait = pr.Delay - b.leadNow()
		if wait < backoff {
			wait = backoff
			if pr.LockTTL > 0 {
				wait = min(wait, pr.LockTTL+time.Millisecond)
			}
			backoff = min(2*backoff, b.cfg.LockTTL/4)
		}
	}
}

// leadNow is how long before its slot a caller polls: a quarter of the
// lookahead, or twice the round trip the client's calls take now when
// that is longer (thousands of callers polling at once), but at most half
// the lookahead, by when the scheduler has surely given the slot. A poll
// whose reply came after the slot leaves the caller late.
func (b *Bucket) leadNow() time.Duration {
	return min(max(b.lead, 2*b.hub.RoundTrip()), b.cfg.Lookahead/2)
}

// sleepToSlot sleeps until the slot, then checks that the caller is not so
// late that its start would bunch with later ones. The reply said "delay
// from Redis's now", and Redis's now lies between sent and received: the
// caller sleeps until received+delay, never before the slot, and judges its
// lateness from sent+delay, less the round trip the network always takes,
// so that a reply that sat unread (a starved or frozen process) counts too.
// A caller later than MaxLateness keeps its place (retime): costs and room
// are what that needs. A caller whose ctx ends before its slot, or whose
// new slot comes after its deadline, leaves (entry: its queue entry, ""
// for one given its slot at arrival) and passes its slot on.
func (b *Bucket) sleepToSlot(ctx context.Context, sent, received time.Time, delay time.Duration, rep *entered, costs []int64, entry, room string) (bool, error) {
	for {
		late, err := b.sleepLate(ctx, sent, received, delay, rep)
		if err != nil {
			if room != "" && !errors.Is(err, errClosed) {
				b.leave(queue.Leaver{Entry: entry, Room: room, Costs: costs})
			}
			return false, err
		}
		if !late {
			return false, nil
		}
		var r queue.Retimed
		if sent, received, r, err = b.retimeOnce(ctx, rep, costs, room); err != nil {
			return b.retimeFailed(ctx, err)
		}
		delay, room = r.Delay, r.Room
		if own := b.ownWait(ctx); own > 0 && delay > own {
			b.leave(queue.Leaver{Entry: entry, Room: room, Costs: costs})
			return false, b.tooLong(delay, own)
		}
	}
}

// retime gives a caller too late for its slot the next one (retimeOnce),
// then sleeps to it as sleepToSlot does.
func (b *Bucket) retime(ctx context.Context, rep *entered, costs []int64, entry, room string) (bool, error) {
	sent, received, r, err := b.retimeOnce(ctx, rep, costs, room)
	if err != nil {
		return b.retimeFailed(ctx, err)
	}
	if own := b.ownWait(ctx); own > 0 && r.Delay > own {
		b.leave(queue.Leaver{Entry: entry, Room: r.Room, Costs: costs})
		return false, b.tooLong(r.Delay, own)
	}
	return b.sleepToSlot(ctx, sent, received, r.Delay, rep, costs, entry, r.Room)
}

// retimeOnce asks Redis for the next slot of a caller too late for its own
// (queue.Retime): it keeps its place ahead of the callers queued, and the
// missed slot's tokens go back to the bucket when that is exact. A late
// caller thus throws nothing away and adds no arrival, so that a starved
// host cannot feed its own overload (docs/design.md, "Overload").
//
// Its call to Redis is bounded as enterOnce's are: when it runs out of its
// limit while Redis answers a PING (slow, not away), it is made again with
// twice the limit; a slot the lost reply held is then spent, never
// granted twice.
func (b *Bucket) retimeOnce(ctx context.Context, rep *entered, costs []int64, room string) (sent, received time.Time, r queue.Retimed, err error) {
	for limit := b.answerWithin(); ; limit = min(2*limit, time.Minute) {
		cctx, done, within := rediscall.CallCtx(ctx, limit)
		sentFn, rctx := sentAt(cctx, b.now)
		r, err = b.q.Retime(rctx, room, costs)
		done()
		received = b.now()
		rep.RoundTrips++
		if err != nil && b.busy(ctx, cctx, within, err) {
			continue
		}
		if err != nil && b.fb != nil && b.fb.away(ctx, err) {
			return sent, received, r, goneLocal{} // the missed slot stays spent
		}
		if err != nil {
			if !errors.As(err, new(*queue.ConfigError)) && !errors.Is(err, queue.ErrNotReplicated) {
				err = b.callErr(ctx, err, within) // retimeFailed reads the others
			}
			return sent, received, r, err
		}
		sent = sentFn() // only now: a failed call may still be stamping it
		break
	}
	b.rtt.observe(received.Sub(sent))
	rep.Retimes++
	if r.Refunded {
		rep.Refunds++
	}
	rep.Slot = time.UnixMicro(r.Slot)
	return sent, received, r, nil
}

// retimeFailed: a Retime that failed leaves the missed slot's tokens spent;
// the caller enters again, unless its ctx ended or Redis failed it.
func (b *Bucket) retimeFailed(ctx context.Context, err error) (bool, error) {
	if errors.As(err, new(goneLocal)) {
		return false, err // enter admits it from the local share
	}
	if ctx.Err() != nil || errors.Is(err, queue.ErrNotReplicated) {
		return false, b.redisErr(ctx, err)
	}
	var cerr *queue.ConfigError
	if errors.As(err, &cerr) {
		return true, nil // a live change: enter again under the policies in force
	}
	return false, b.redisErr(ctx, err)
}

// sleepLate sleeps until the slot and reports whether the caller is later
// than MaxLateness.
func (b *Bucket) sleepLate(ctx context.Context, sent, received time.Time, delay time.Duration, rep *entered) (bool, error) {
	rep.Margin = sent.Add(delay).Sub(received)
	if err := b.hub.Sleep(ctx, received.Add(delay).Sub(b.now()), b.bg.Done()); err != nil {
		if errors.Is(err, hub.ErrStopped) {
			err = errClosed
		}
		return false, err // sleepToSlot passes the slot on
	}
	rep.Late = max(0, b.now().Sub(sent.Add(delay))-b.rtt.min())
	if b.cfg.MaxLateness >= 0 && rep.Late > b.cfg.MaxLateness {
		return true, nil
	}
	return false, nil
}

// sleep waits d, or until a hint comes (then it returns the slot the hint
// gives, µs on the Redis clock; 0 when none), ctx ends or the bucket
// closes; or, with a local share, until it switched or Redis's
// reachability changed (errReach).
func (b *Bucket) sleep(ctx context.Context, d time.Duration, hints <-chan int64, switched, reach <-chan struct{}) (int64, error) {
	if d <= 0 {
		return 0, nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return 0, nil
	case slot := <-hints:
		return slot, nil
	case <-switched:
		return 0, errReach
	case <-reach:
		return 0, errReach
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-b.bg.Done():
		return 0, errClosed
	}
}

// cancel takes a caller that gives up out of the queue, by its entry or,
// if it never learned it, by its ID, in the background: the caller returns
// at once even if Redis hangs.
func (b *Bucket) cancel(entry string) { b.comings.leave(queue.Leaver{Entry: entry}) }

// leave is cancel for a caller that read its slot: its tokens pass on.
func (b *Bucket) leave(l queue.Leaver) { b.comings.leave(l) }

// ownWait is the longest a caller may wait for its slot: until its ctx's
// deadline, less the trip a reply takes (a slot at the deadline would
// find the caller gone), and at least 1 µs (with nothing left, only a
// token free at once serves it). 0: no deadline.
func (b *Bucket) ownWait(ctx context.Context) time.Duration {
	dl, ok := ctx.Deadline()
	if !ok {
		return 0
	}
	return max(dl.Sub(b.now())-b.rtt.min(), time.Microsecond)
}

// tooLong is the refusal of a caller whose estimated wait est passes what
// it may wait: own (ownWait; 0: none) or MaxWait, whichever is shorter.
func (b *Bucket) tooLong(est, own time.Duration) error {
	e := &sluice.WaitTooLongError{Limiter: "bucket", Name: b.cfg.Name, Wait: est, Limit: b.cfg.MaxWait, Err: errWaitTooLong}
	if own > 0 && (b.cfg.MaxWait <= 0 || own < b.cfg.MaxWait) {
		e.Limit, e.Deadline = own, true
	}
	return e
}

// answerWithin bounds each call to Redis made for a caller whose ctx has
// no earlier deadline: rediscall.AnswerWithin, plus 4 × ReplicaTimeout
// when the call waits for replicas (ReplicaAcks: a poll may make several
// round trips, each with its WAIT, and a script sent again after NOSCRIPT
// waits again).
func (b *Bucket) answerWithin() time.Duration {
	if b.cfg.ReplicaAcks > 0 {
		return rediscall.AnswerWithin + 4*b.cfg.ReplicaTimeout
	}
	if b.fb != nil {
		// A frozen Redis sends a caller in flight to its share this soon:
		// the probe's verdict (AwayAfter) and a round of it to spare.
		return hub.AwayAfter + 2*hub.ProbeEvery
	}
	return rediscall.AnswerWithin
}

// busy reports that a call made on cctx (rediscall.CallCtx(ctx), which
// added the limit within; cancelled since) ran out of that limit (err, its
// error, a timeout), not of ctx, while Redis still answers a PING: it is slow (a burst of thousands
// of arrivals), not away, and the call may be made again.
func (b *Bucket) busy(ctx, cctx context.Context, within time.Duration, err error) bool {
	// go-redis sets the socket's deadline from cctx's: its read may time
	// out a moment before cctx reports it.
	var ne net.Error
	timedOut := errors.Is(cctx.Err(), context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
	if within <= 0 || ctx.Err() != nil || !timedOut {
		return false
	}
	if b.fb != nil {
		return b.fb.answers(ctx, b.now().Add(-within)) // the probe's verdict since the call began
	}
	return b.hub.Answers(ctx, rediscall.AnswerWithin)
}

// redisErr reports sluice.ErrClosed after Close, and otherwise an error that
// matches both the caller's ctx error, when its ctx (or deadline) is what
// cut the call short, and Redis's.
func (b *Bucket) redisErr(ctx context.Context, err error) error {
	return b.callErr(ctx, err, 0)
}

// callErr is redisErr for a call made on rediscall.CallCtx, whose
// limit added is within: when that limit ended the call, the error says
// Redis gave no answer within it (and why, when a dial shows it), and
// does not match the caller's ctx errors.
func (b *Bucket) callErr(ctx context.Context, err error, within time.Duration) error {
	select {
	case <-b.bg.Done(): // Close cut the call short
		return errClosed
	default:
	}
	if errors.Is(err, queue.ErrNotReplicated) {
		return fmt.Errorf("%w: %v", ErrNotReplicated, err)
	}
	return rediscall.RedisError(ctx, "bucket", b.cfg.Name, b.rdb, err, within)
}
