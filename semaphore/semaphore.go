package semaphore

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
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

// The Semaphore handle: its errors, its state, New and Close.

var (
	// errClosed is returned by Acquire and Do after Close, and by an
	// Acquire that was waiting when Close was called: sluice.ErrClosed.
	errClosed = configerr.Kind("semaphore", sluice.ErrClosed)

	// errQueueFull is returned by Acquire when Config.MaxQueue callers
	// already wait: sluice.ErrQueueFull, which wraps sluice.ErrLimited.
	errQueueFull = configerr.Kind("semaphore", sluice.ErrQueueFull)

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
// first served by their arrival at Redis, whatever their weights, within
// a lane (WithLane); between lanes, by weight and priority.
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
	keys        []string // leases, queue, seq, weights, config: sync.lua's first KEYS
	lanes       string   // the start of the lanes' keys (suffixLanes), sync.lua's last KEYS
	syncKeys    []string // keys, then lanes
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
	lane     string    // what its id ends with: its lane, weight and priority (laneOf)
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
			lanes:       base + suffixLanes,
			chanPrefix:  base + suffixWake + ":",
			proc:        hex.EncodeToString(raw[:]),
			callTimeout: max(2*cfg.beat(), 100*time.Millisecond),
		},
		runner:  runner{kickCh: make(chan struct{}, 1)},
		callers: callers{waiters: make(map[string]*waiter), holders: make(map[string]*Permit)},
		heard:   heard{capacity: cfg.Capacity, accepted: cfg.Adopt},
	}
	s.syncKeys = append(append([]string(nil), s.keys...), s.lanes)
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
