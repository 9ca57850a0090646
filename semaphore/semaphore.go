package semaphore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/background"
	"github.com/sluicehq/sluice/internal/configerr"
	"github.com/sluicehq/sluice/internal/hub"
	"github.com/sluicehq/sluice/internal/presence"
	"github.com/sluicehq/sluice/internal/rediscall"
	"github.com/sluicehq/sluice/internal/scriptreply"
	"github.com/sluicehq/sluice/internal/verdict"
)

var (
	// errClosed is returned by Acquire and Do after Close, and by an
	// Acquire that was waiting when Close was called: sluice.ErrClosed.
	errClosed = fmt.Errorf("semaphore: %w", sluice.ErrClosed)

	// errQueueFull is returned by Acquire when Config.MaxQueue callers
	// already wait: sluice.ErrQueueFull, which wraps sluice.ErrLimited.
	errQueueFull = fmt.Errorf("semaphore: %w", sluice.ErrQueueFull)

	// errConfig is wrapped by every error New returns; it matches
	// sluice.ErrConfig.
	errConfig = configerr.New("semaphore")

	// ErrLeaseLost reports that a permit's lease ended before it was
	// released: it could not be renewed in time (the process stalled or
	// Redis was unreachable), Redis lost it (a restart without
	// persistence), or the Semaphore was closed. Another caller may have
	// been given the place since.
	ErrLeaseLost = errors.New("semaphore: lease lost")
)

// Semaphore is a distributed weighted semaphore: the weights of the
// permits held at any instant, across every process using the same Redis
// and Config.Name, sum to at most Config.Capacity (Acquire takes a permit
// of weight 1, AcquireN one of weight n). Waiters are served first come,
// first served by their arrival at Redis, whatever their weights.
//
// A Semaphore runs a dispatcher goroutine, which batches every Redis
// exchange of this process (acquires, releases, renewals) into one script
// call at a time, only while it has work: callers waiting, permits held,
// or exchanges pending. Grant notifications come over the Pub/Sub
// connection that every bucket and semaphore on the same Redis client
// shares, listened to only while callers wait. An idle Semaphore runs no
// goroutine and holds no connection. Close stops the dispatcher. A
// Semaphore is safe for concurrent use; use one per process and semaphore
// name.
type Semaphore struct {
	setup
	counts
	runner

	// mu guards the groups below it (and every waiter's and Permit's
	// mutable fields); it is taken before runner.dmu, never after it.
	mu sync.Mutex
	callers
	outbox
	heard
	fallbackState
}

// setup is what New fixes and nothing changes after it: read by every
// goroutine without a lock.
type setup struct {
	rdb         redis.UniversalClient
	cfg         Config
	keys        []string // leases, queue, seq, weights, config: the KEYS of sync.lua
	chanPrefix  string   // + process id = a process's wake channel
	fixedArgs   []any    // sync.lua's ARGV[2..6] and ARGV[14..15], boxed once
	proc        string   // this Semaphore's id, the prefix of its permit ids
	callTimeout time.Duration
	hub         *hub.Hub       // the Pub/Sub shared by every handle on rdb
	scripts     redis.Scripter // rdb, its script calls sharing round trips with every handle's (hub.Client)
	// trace is this process's presence in Redis, which divides the
	// capacity at a switch to the local share: nil without
	// Config.Fallback (fallback.go). It is safe for concurrent use.
	trace *presence.Trace
}

// counts are atomics, read without a lock: the ids of arrivals and the
// figures of Stats and the Observer. held and leasesLost are written
// under mu, beside the holders they follow; Stats reads them without it.
type counts struct {
	nextID     atomic.Uint64 // the last arrival's sequence number in this process
	tally      verdict.Tally // the calls; its names are set by New
	held       atomic.Int64  // the weight held by this process's permits now
	leasesLost atomic.Int64  // the leases lost while held
}

// runner starts and wakes the dispatcher. Its fields are set by New;
// only dispatching changes, under dmu.
type runner struct {
	bg          *background.Group // the dispatcher while it has work, a trace being sent, a call to a Redis that may be away
	kickCh      chan struct{}     // wakes the dispatcher (buffered: one wake-up pending at most)
	poke        *time.Timer       // asks for a beat when the first lease ends; reset by exchange
	dmu         sync.Mutex
	dispatching bool // the dispatcher runs; guarded by dmu
}

// callers are this process's callers, waiting and holding; guarded by mu.
// Written by the callers themselves (Acquire, Release, Close), by the
// exchanges' replies, by wake (the Hub's goroutine) and by lease timers.
type callers struct {
	closed     bool
	waiters    map[string]*waiter // waiting, by id
	holders    map[string]*Permit // held, by id
	stopListen func()             // stops the grant notifications; nil while none is wanted
}

// outbox is what the next exchange with Redis carries, and the exchange
// in flight; guarded by mu. Callers (Acquire, Release, Close) and the
// reply of the last exchange add to it; take empties it into a batch.
type outbox struct {
	pendAcquire  []*waiter     // not yet sent to Redis
	pendRelease  []releaseOp   // to send at the next exchange (the dispatcher's, or a lone arrival's)
	pendLeave    []leaveOp     // to send at the next exchange
	retryRelease []releaseOp   // failed; sent again at the next beat
	retryLeave   []leaveOp     // failed; sent again at the next beat
	beatDue      bool          // the next exchange renews, refreshes and retries
	sending      bool          // this process's exchange is in flight (one at a time)
	sent         chan struct{} // closed when the exchange in flight ends, if someone waits (flush)
}

// heard is what this process last heard from Redis; guarded by mu.
// Written by the exchanges' replies and failures (and by a switch to or
// from the local share), read by callers.
type heard struct {
	lastErr      error // why the last exchange failed; nil once one succeeds
	capacity     int   // in force, as last heard from Redis; cfg.Capacity before
	accepted     bool  // Redis ran a call under capacity: follow its changes
	mismatchSaid int64 // the capacity in force last logged as refusing ours
}

// fallbackState is Config.Fallback's switch to the local share and back
// (fallback.go); guarded by mu. It stays at onRedis without a fallback.
type fallbackState struct {
	mode     fallbackMode
	share    int       // weight this process may hold while local
	procs    int       // the count the share divided by
	since    time.Time // the last switch to local
	settleAt time.Time // settling: when the waiters go back to Redis
	localQ   []*waiter // waiting for the local share, in order
}

// waiter is one Acquire in progress. Its fields are guarded by
// Semaphore.mu.
type waiter struct {
	id       string
	weight   int
	seq      uint64    // arrival order in this process
	local    bool      // in the local queue (Config.Fallback), or granted from it
	sent     bool      // its arrival has been sent to Redis
	done     bool      // granted, failed or abandoned
	ticket   int64     // its place in the queue, once known
	deadline time.Time // its queue lease in Redis lasts at least until then
	ch       chan struct{}
	permit   *Permit
	err      error
}

type releaseOp struct {
	id    string
	until time.Time // after this the lease is gone anyway: no retry
	// asked: released by its holder, whose lease was valid as far as this
	// process knew; Redis not having it is a loss to report. Not for a
	// retry (the first try may have freed it) or a lease already lost.
	asked bool
}

type leaveOp struct {
	id    string
	until time.Time
}

// New returns a Semaphore on rdb described by cfg. It validates cfg; it
// starts no goroutine (one runs only while callers wait) and does not
// talk to Redis, so it succeeds while Redis is down. The caller must call
// Close.
//
// rdb must have ContextTimeoutEnabled set, or New refuses it (sluice.ErrConfig):
// go-redis would otherwise ignore context deadlines shorter than its
// ReadTimeout, and a frozen Redis could hold a call for that long.
func New(rdb redis.UniversalClient, cfg Config) (*Semaphore, error) {
	if err := rediscall.CheckClient(errConfig, rdb); err != nil {
		return nil, err
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	var raw [12]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return nil, fmt.Errorf("semaphore: process id: %w", err)
	}
	base := keyBase(cfg.KeyPrefix, cfg.Name)
	s := &Semaphore{
		setup: setup{
			rdb:         rdb,
			cfg:         cfg,
			keys:        []string{base + suffixLeases, base + suffixQueue, base + suffixSeq, base + suffixWeights, base + suffixConfig},
			chanPrefix:  base + suffixWake + ":",
			proc:        hex.EncodeToString(raw[:]),
			callTimeout: max(2*cfg.beat(), 100*time.Millisecond),
		},
		runner:  runner{kickCh: make(chan struct{}, 1)},
		callers: callers{waiters: make(map[string]*waiter), holders: make(map[string]*Permit)},
		heard:   heard{capacity: cfg.Capacity, accepted: cfg.Adopt},
	}
	s.fixedArgs = []any{scriptreply.Micros(cfg.LeaseTTL), scriptreply.Micros(cfg.QueueTTL), cfg.MaxQueue, s.chanPrefix, s.proc,
		storeFormat, keepConfig.Milliseconds()}
	s.tally.Limiter, s.tally.Name, s.tally.Observer = "semaphore", cfg.Name, cfg.Observer
	s.poke = time.AfterFunc(time.Hour, s.requestBeat)
	s.poke.Stop()
	s.hub = hub.Acquire(rdb)
	s.scripts = s.hub.Pipelining()
	// The dispatcher starts at the first kick; it ignores the group's ctx:
	// at Close it still sends what is pending (leaves, releases), each
	// exchange bounded by callTimeout, and returns once nothing is left.
	s.bg = background.NewGroup()
	if cfg.Fallback == LocalShare {
		s.trace = presence.New(s.scripts, base+suffixProcs)
	}
	return s, nil
}

// Acquire waits for a permit of weight 1 and returns it; it is
// AcquireN(ctx, 1). The caller must Release it. While held, the permit's
// lease is renewed in the background; if it is lost anyway, Permit.Lost is
// closed.
//
// Acquire returns an error matching ctx.Err() when ctx ends first, and then
// gives its place in the queue up; while Redis is unreachable that error
// also matches, and names, Redis's last error ("connection refused"). It
// returns sluice.ErrQueueFull when Config.MaxQueue callers already wait,
// sluice.ErrClosed after Close, sluice.ErrConfigMismatch when Config.Capacity differs
// from the capacity in force (see Config.Adopt), and an error wrapping
// Redis's when its arrival cannot be recorded.
//
// While Redis is unreachable (it refuses connections, or does not answer)
// Acquire fails, whatever its ctx, within min(Config.LeaseTTL,
// Config.QueueTTL) (2 s by default; at least 150 ms), or at its ctx's
// deadline if that comes first: this process's exchanges with Redis, one
// every third of that time while callers wait, each give up after two
// thirds of it, and a waiter fails with the first exchange that fails
// (its place in Redis could not be kept anyway). The error says so in a
// person's words ("semaphore \"api\": Redis at 127.0.0.1:6379
// unreachable: connection refused (no answer within 1.3s)") and matches
// the network's error (syscall.ECONNREFUSED); it matches ctx.Err() only
// when ctx ended first.
//
// With Config.Fallback set to LocalShare, Acquire does not fail because
// Redis is unreachable: within the probe's bound (a refused connection at
// once, no answer for 200 ms) it waits for, and is granted
// from, this process's local share instead (see LocalShare). It still
// fails so in a process that has not reached Redis since it started (the
// error says there is no local share), when its weight is above the local
// share (it could not be granted before Redis answers again), and when
// Redis answers with an error (READONLY, OOM), which is never a reason to
// switch.
func (s *Semaphore) Acquire(ctx context.Context) (*Permit, error) {
	return s.AcquireN(ctx, 1)
}

// AcquireN waits for a permit of weight n, worth n of Config.Capacity, and
// returns it, as Acquire does for weight 1; Release gives the whole weight
// back. The weights held never sum above Capacity.
//
// Waiters are served in arrival order whatever their weights: a waiter at
// the head of the queue waits until its n are free, and those behind it
// wait too, even a lighter one that would fit (no overtaking, so a heavy
// waiter is never starved). Giving up (ctx ends) frees its place and those
// behind move up. MaxQueue counts waiters, not weights.
//
// A weight above the capacity could never be granted: AcquireN refuses it
// with an error matching sluice.ErrCostExceedsCapacity, at once and without
// talking to Redis when it is above the capacity this process last heard
// of (Config.Capacity before its first call), else when Redis answers. A
// waiter whose weight is above a capacity lowered by SetCapacity while it
// waits gets that error too, when it next hears from Redis. A weight below
// 1 is an error (a bug in the caller, which the Observer is not told of).
func (s *Semaphore) AcquireN(ctx context.Context, n int) (p *Permit, err error) {
	if n < 1 {
		return nil, fmt.Errorf("semaphore: weight %d, want at least 1", n)
	}
	var start time.Time
	if s.cfg.Observer != nil {
		start = time.Now()
	}
	s.tally.Begin()
	var queued, local bool
	defer func() {
		res, why := verdict.Classify(ctx, err, reasons...)
		e := sluice.Event{Result: res, Reason: why, Queued: queued, Local: local}
		if !start.IsZero() {
			e.Wait = time.Since(start)
		}
		s.tally.End(e)
	}()
	p, queued, local, err = s.acquire(ctx, n)
	return p, err
}

// reasons are the semaphore's errors as Events name them; the shared ones
// (sluice.ErrCostExceedsCapacity, sluice.ErrConfigMismatch, a ctx's) are
// verdict.Classify's.
var reasons = []verdict.Reason{
	{Err: errQueueFull, Result: sluice.Refused, Name: "queue_full"},
	{Err: errClosed, Result: sluice.Failed, Name: "closed"},
	// State written by a newer version: the deployment disagrees with
	// itself, as with a Capacity of its own.
	{Err: errUnknownFormat, Result: sluice.Failed, Name: "config_mismatch"},
}

// acquire is AcquireN for a valid weight n; queued reports that the
// caller waited in the queue in Redis (it was not granted on arrival),
// local that it was served, or failed, by the local share
// (Config.Fallback).
func (s *Semaphore) acquire(ctx context.Context, n int) (_ *Permit, queued, local bool, _ error) {
	s.mu.Lock()
	capacity := s.capacity
	s.mu.Unlock()
	if n > capacity {
		return nil, false, false, s.tooHeavy(n, capacity)
	}
	if err := ctx.Err(); err != nil {
		return nil, false, false, err
	}
	seq := s.nextID.Add(1)
	w := &waiter{id: s.idOf(seq, n), weight: n, seq: seq, ch: make(chan struct{})}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, false, false, errClosed
	}
	s.waiters[w.id] = w
	s.listenLocked()
	if s.mode != onRedis {
		// Redis is away, or this process has just registered its permits
		// there and waits for the others to (fallback.go).
		w.local = true
		s.localQ = append(s.localQ, w)
		s.serveLocalLocked()
		s.mu.Unlock()
		s.kick()
		return s.await(ctx, w)
	}
	// A process has one exchange in flight at a time, so everything asked
	// for meanwhile goes out together in the next (and a leave can never
	// overtake its arrival). A lone arrival (no exchange in flight, and
	// no other caller of this process waiting or holding) goes out at once
	// from this goroutine: no hop to the dispatcher and back. It carries
	// the releases pending, so a caller that released and acquires again
	// pays one round trip; the rest (others' arrivals, leaves) is the
	// dispatcher's, because this exchange is bound to this caller's ctx.
	// Where other callers are busy, the dispatcher batches them all (64
	// looping callers on 64 permits in 4 processes: 8.5 → 15 grants per
	// script call).
	direct := !s.sending && len(s.pendAcquire) == 0 && len(s.holders) == 0 && len(s.waiters) == 1
	var releases []releaseOp
	if direct {
		s.sending = true
		w.sent = true
		w.deadline = time.Now().Add(s.cfg.QueueTTL)
		releases, s.pendRelease = s.pendRelease, nil
	} else {
		s.pendAcquire = append(s.pendAcquire, w)
	}
	s.mu.Unlock()
	s.sendTrace()
	if direct {
		if s.trace != nil {
			// The dispatcher follows Redis's reachability: a frozen
			// Redis switches this exchange to local within the probe's
			// bound rather than its own.
			s.kick()
		}
		s.exchange(ctx, batch{acquires: []*waiter{w}, releases: releases, wantWait: true})
		s.mu.Lock()
		s.doneSendingLocked()
		more := s.pendingLocked()
		s.mu.Unlock()
		if more {
			s.kick() // what came meanwhile is the dispatcher's
		}
	} else {
		s.kick()
	}
	return s.await(ctx, w)
}

// await waits for w to be decided, or gives its place up when ctx ends
// first.
func (s *Semaphore) await(ctx context.Context, w *waiter) (_ *Permit, queued, local bool, _ error) {
	select {
	case <-w.ch:
		// A ticket is written only before the waiter is decided.
		return w.permit, w.ticket > 0, w.local, w.err
	case <-ctx.Done():
	}
	s.mu.Lock()
	if w.done {
		// Decided while ctx ended: the outcome stands.
		s.mu.Unlock()
		return w.permit, w.ticket > 0, w.local, w.err
	}
	local = w.local
	s.abandonLocked(w)
	queued = w.ticket > 0
	last := s.lastErr
	s.mu.Unlock()
	s.kick()
	if last != nil {
		// Redis is unreachable: say why, as well as that ctx ended.
		return nil, queued, local, s.callError(last).WithCtx(ctx.Err())
	}
	return nil, queued, local, ctx.Err()
}

// idOf is the id of arrival seq of weight n. The weight travels in the id
// (see sync.lua), so any process can grant it; weight 1 keeps the plain id.
func (s *Semaphore) idOf(seq uint64, n int) string {
	id := s.proc + ":" + strconv.FormatUint(seq, 10)
	if n > 1 {
		id += ":" + strconv.Itoa(n)
	}
	return id
}

// newID is a fresh id of weight n.
func (s *Semaphore) newID(n int) string { return s.idOf(s.nextID.Add(1), n) }

// errCostExceedsCapacity is wrapped by the refusal of a weight above the
// capacity in force (sluice.ErrCostExceedsCapacity: AcquireN's doc).
var errCostExceedsCapacity = fmt.Errorf("semaphore: %w", sluice.ErrCostExceedsCapacity)

// tooHeavy is the refusal of a weight n above the capacity in force.
func (s *Semaphore) tooHeavy(n, capacity int) error {
	return fmt.Errorf("%w: weight %d above Capacity %d of semaphore %q, so it could never be granted",
		errCostExceedsCapacity, n, capacity, s.cfg.Name)
}

// loweredBelow is the refusal of a waiter of weight n after SetCapacity
// lowered the capacity below n.
func (s *Semaphore) loweredBelow(n int) error {
	return fmt.Errorf("%w: weight %d above the capacity of semaphore %q, lowered below it (SetCapacity) while it waited, so it could never be granted",
		errCostExceedsCapacity, n, s.cfg.Name)
}

// Do acquires a permit, runs fn, and releases the permit after fn returns,
// even if fn panics. fn's context is cancelled, with cause ErrLeaseLost,
// if the lease is lost while fn runs. Do returns Acquire's error, or fn's
// error, or ErrLeaseLost if fn succeeded but the lease was lost before it
// was released.
func (s *Semaphore) Do(ctx context.Context, fn func(ctx context.Context) error) (err error) {
	p, err := s.Acquire(ctx)
	if err != nil {
		return err
	}
	fctx, cancel := context.WithCancelCause(ctx)
	stop := make(chan struct{})
	var watch sync.WaitGroup
	watch.Add(1)
	go func() {
		defer watch.Done()
		select {
		case <-p.lost:
			cancel(ErrLeaseLost)
		case <-stop:
		}
	}()
	defer func() {
		close(stop)
		watch.Wait()
		cancel(nil)
		// Release even when ctx has ended; a release that fails leaves a
		// lease that expires on its own.
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), s.callTimeout)
		relErr := p.Release(rctx)
		rcancel()
		if err == nil && errors.Is(relErr, ErrLeaseLost) {
			err = ErrLeaseLost
		}
	}()
	return fn(fctx)
}

// SetCapacity makes n the capacity in force, for every process using this
// semaphore at once: one script call stores it in Redis and applies it
// there. Processes that had acquired under the old capacity follow it
// from their next call; processes that start later with another
// Config.Capacity get sluice.ErrConfigMismatch unless they set Config.Adopt.
//
// Raising the capacity grants the waiters it makes room for in that same
// call and wakes them at once. Lowering it never revokes a permit: the
// weights already held stay held, and nobody is admitted until they fall
// below n. A waiter heavier than n could never be granted: it leaves the
// queue in that call (or the next that reaches it), and its AcquireN
// returns an error matching sluice.ErrCostExceedsCapacity; those behind it move
// up. SetCapacity works whether or not anyone holds or waits, and the
// capacity stays stored while the semaphore is used, and for a week
// after its last use.
//
// n must be at least 1 (else sluice.ErrConfig). It returns sluice.ErrClosed after Close,
// an error naming the format for state written by a newer version, and
// an error wrapping Redis's (matching ctx.Err() when ctx ended first) when
// Redis did not answer; the change may then have happened or not.
func (s *Semaphore) SetCapacity(ctx context.Context, n int) error {
	if n < 1 {
		return configerr.Invalid(errConfig, "capacity %d, want at least 1", n)
	}
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return errClosed
	}
	done := make(chan error, 1)
	s.exchange(ctx, batch{set: &setOp{n: n, done: done}})
	err := <-done
	if err != nil && ctx.Err() != nil && !errors.Is(err, ctx.Err()) {
		return s.callError(err).WithCtx(ctx.Err())
	}
	return err
}

// Capacity returns the capacity in force: the one stored in Redis, or,
// when none is (nobody has used the semaphore for a week, or ever), the
// one this process would store at its next call: Config.Capacity, or the
// capacity it last followed. It returns an error naming the format for
// state written by a newer version, and an error wrapping Redis's when
// Redis did not answer.
func (s *Semaphore) Capacity(ctx context.Context) (int, error) {
	v, err := s.rdb.HMGet(ctx, s.keys[4], fieldFormat, fieldCapacity).Result()
	if err != nil {
		return 0, rediscall.RedisError(ctx, "semaphore", s.cfg.Name, s.rdb, err, 0)
	}
	if len(v) != 2 {
		return 0, fmt.Errorf("%w: HMGET of 2 fields returned %d", errReply, len(v))
	}
	n, ok, err := s.parseStored(v[0], v[1])
	if err != nil || ok {
		return n, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.capacity, nil
}

// Close gives up every place this Semaphore holds: waiting Acquire calls
// return sluice.ErrClosed, held permits are released in Redis and their Lost
// channels closed. It stops the Semaphore's goroutines and waits for them.
// It does not close the Redis client. Close is safe to call more than once.
func (s *Semaphore) Close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	for _, w := range s.waiters {
		if w.sent {
			s.pendLeave = append(s.pendLeave, leaveOp{id: w.id})
		}
		w.err = errClosed
		s.finishLocked(w)
	}
	s.pendAcquire, s.localQ = nil, nil
	for _, p := range s.holders {
		s.loseLocked(p, "")
	}
	s.unlistenLocked()
	s.mu.Unlock()
	s.kick()
	s.bg.Close()
	s.hub.Release()

	s.poke.Stop()

	// Whatever the lanes could not send expires in Redis on its own.
	s.mu.Lock()
	s.pendRelease, s.pendLeave, s.retryRelease, s.retryLeave = nil, nil, nil, nil
	s.mu.Unlock()
	return nil
}

// doneSendingLocked ends the exchange in flight and wakes flush.
func (s *Semaphore) doneSendingLocked() {
	s.sending = false
	if s.sent != nil {
		close(s.sent)
		s.sent = nil
	}
}

// flush waits until the releases made so far in this process have been
// sent to Redis (or failed, and wait for a later beat), or ctx ends.
func (s *Semaphore) flush(ctx context.Context) error {
	for {
		s.mu.Lock()
		if (len(s.pendRelease) == 0 && !s.sending) || s.closed || s.mode == onLocal {
			// Close sends what is pending itself; while Redis is away
			// nothing is sent before it answers.
			s.mu.Unlock()
			return nil
		}
		if s.sent == nil {
			s.sent = make(chan struct{})
		}
		ch, idle := s.sent, !s.sending
		s.mu.Unlock()
		if idle {
			s.kick()
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// pendingLocked reports work for the dispatcher.
func (s *Semaphore) pendingLocked() bool {
	return len(s.pendAcquire)+len(s.pendRelease)+len(s.pendLeave) > 0 || s.beatDue
}

// kick wakes the dispatcher, starting it if it is not running. It may be
// called with mu held.
func (s *Semaphore) kick() {
	select {
	case s.kickCh <- struct{}{}:
	default:
	}
	s.dmu.Lock()
	defer s.dmu.Unlock()
	if !s.dispatching && s.bg.Go(func(context.Context) { s.dispatch() }) {
		s.dispatching = true
	}
}

// idle reports, and marks the dispatcher stopped, when it has no work left:
// nobody waits, nothing is held, nothing is pending or to retry.
func (s *Semaphore) idle() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mode == onLocal {
		s.pruneLocked()
	}
	if len(s.waiters)+len(s.holders)+len(s.retryRelease)+len(s.retryLeave) > 0 || s.sending || s.pendingLocked() {
		return false
	}
	s.dmu.Lock()
	s.dispatching = false
	s.dmu.Unlock()
	return true
}

// listenLocked listens for grant notifications while callers wait. Called
// with mu held.
func (s *Semaphore) listenLocked() {
	if s.stopListen == nil && !s.closed {
		// A notification published before Redis confirms the
		// subscription is lost: a beat then asks Redis.
		s.stopListen = s.hub.Listen(s.chanPrefix+s.proc, s.wake, s.requestBeat)
	}
}

// unlistenLocked stops listening once nobody waits. Called with mu held.
func (s *Semaphore) unlistenLocked() {
	if s.stopListen != nil && (len(s.waiters) == 0 || s.closed) {
		s.stopListen()
		s.stopListen = nil
	}
}

// requestBeat makes the dispatcher renew, refresh and poll soon.
func (s *Semaphore) requestBeat() {
	s.mu.Lock()
	s.beatDue = true
	s.mu.Unlock()
	s.kick()
}

// abandonLocked gives up w's place: an Acquire's ctx ended.
func (s *Semaphore) abandonLocked(w *waiter) {
	w.done = true
	delete(s.waiters, w.id)
	s.unlistenLocked()
	if w.local {
		s.dropLocalLocked(w)
		return
	}
	if !w.sent {
		for i, x := range s.pendAcquire {
			if x == w {
				s.pendAcquire = append(s.pendAcquire[:i], s.pendAcquire[i+1:]...)
				break
			}
		}
		return
	}
	// It may be in the queue, or granted already: leave handles both.
	s.pendLeave = append(s.pendLeave, leaveOp{id: w.id, until: time.Now().Add(s.cfg.QueueTTL)})
}

// finishLocked ends w with w.permit or w.err set.
func (s *Semaphore) finishLocked(w *waiter) {
	w.done = true
	delete(s.waiters, w.id)
	s.unlistenLocked()
	close(w.ch)
}

// grantLocked turns w into a permit valid until deadline. A deadline in
// the past (this process stalled) is not a grant: the next beat asks Redis
// again.
func (s *Semaphore) grantLocked(w *waiter, deadline time.Time) {
	if w.done {
		return
	}
	d := time.Until(deadline)
	if d <= 0 {
		s.beatDue = true
		return
	}
	p := &Permit{s: s, id: w.id, weight: w.weight, deadline: deadline, lost: make(chan struct{})}
	p.timer = time.AfterFunc(d, func() { s.checkLease(p) })
	s.holders[p.id] = p
	s.held.Add(int64(p.weight))
	w.permit = p
	s.finishLocked(w)
}

// checkLease runs when p's deadline may have passed.
func (s *Semaphore) checkLease(p *Permit) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if p.state != held || p.unregistered {
		return // no lease to lose while Redis is away (fallback.go)
	}
	if d := time.Until(p.deadline); d > 0 {
		p.timer.Reset(d)
		return
	}
	s.loseLocked(p, "not renewed in time")
	s.kick()
}

// loseLocked ends a held permit whose lease is gone or going, and frees its
// place in Redis in case the lease still stands there. why says how it
// was lost, for Stats and the Logger; "" when Close ends it, which is no
// loss to report.
func (s *Semaphore) loseLocked(p *Permit, why string) {
	p.state = lost
	p.stopTimer()
	delete(s.holders, p.id)
	s.held.Add(-int64(p.weight))
	if why != "" {
		s.leasesLost.Add(1)
		if l := s.cfg.Logger; l != nil {
			// Rare, and said under s.mu so it comes before anything the
			// loss leads to.
			l.Warn("sluice: semaphore permit's lease lost while held: another caller may hold its place now",
				"semaphore", s.cfg.Name, "permit", p.id, "weight", p.weight, "why", why)
		}
	}
	close(p.lost)
	if p.inRedis() {
		s.pendRelease = append(s.pendRelease, releaseOp{id: p.id, until: time.Now().Add(s.cfg.LeaseTTL)})
	}
}

// releaseLocked ends a held permit at its holder's request; send reports
// that Redis may hold its lease, which op frees.
func (s *Semaphore) releaseLocked(p *Permit) (op releaseOp, send bool) {
	p.state = released
	p.stopTimer()
	delete(s.holders, p.id)
	s.held.Add(-int64(p.weight))
	// A permit held through an outage may have lost its lease in Redis
	// unnoticed: no loss to report if Redis no longer has it.
	return releaseOp{id: p.id, until: p.deadline, asked: !p.unregistered}, p.inRedis()
}

// wake grants the waiters named in a notification. Their grant keeps
// their queue lease, which lasts at least until their local deadline.
func (s *Semaphore) wake(payload string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for len(payload) > 0 {
		id := payload
		if i := strings.IndexByte(payload, ' '); i >= 0 {
			id, payload = payload[:i], payload[i+1:]
		} else {
			payload = ""
		}
		if refused, ok := strings.CutPrefix(id, "!"); ok {
			if w := s.waiters[refused]; w != nil && w.sent && !w.done {
				w.err = s.loweredBelow(w.weight)
				s.finishLocked(w)
			}
			continue
		}
		if w := s.waiters[id]; w != nil && w.sent {
			s.grantLocked(w, w.deadline)
		}
	}
	if s.beatDue {
		s.kick()
	}
}
