package hub

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Reachability: whether Redis answers, for the handles that fall back to a
// local share while it does not (Config.Fallback). While at least one
// handle watches, one goroutine per Hub PINGs Redis every ProbeEvery,
// each PING bounded by AwayAfter: a PING that fails or goes unanswered
// marks Redis away, and the first one answered while away marks it back.
// A handle whose own call finds Redis away says so (MarkAwayBecause), so that a
// refused connection switches every handle at once rather than at the
// next probe. Nothing runs while no handle watches.
//
// The probe has a connection of its own (a client of one connection with
// the user's options, for a *redis.Client: a plain client or a Sentinel
// failover client), so that callers queued for the user's pool under load
// do not hold its PING up and make a busy Redis look away, and so that a
// refused dial fails at once rather than after go-redis's dial retries;
// after a failure it dials afresh, rather than waiting out the second
// go-redis waits between dials of a pool that failed. Other clients
// (Cluster, Ring) are PINGed through their own pools.

// The probe's timing: Redis is away once a PING has gone unanswered for
// AwayAfter (or failed), found within ProbeEvery + AwayAfter of a freeze
// and within ProbeEvery of a refused connection.
const (
	ProbeEvery = 25 * time.Millisecond
	AwayAfter  = 200 * time.Millisecond
)

// reach is the Hub's reachability state.
type reach struct {
	// answers: Answers's PING, one at a time on a connection of its own
	// (made at the first Answers, closed with the Hub).
	amu      sync.Mutex
	aping    func(ctx context.Context) error
	inflight chan struct{} // closed when the PING in flight has its verdict
	aok      bool          // that verdict
	aat      time.Time     // when the last PING was answered
	// replied: the latest send time (since epoch, ns) of a call answered
	// (Replied), the PING's or a limiter's.
	replied atomic.Int64

	h        *Hub
	mu       sync.Mutex
	watchers int
	running  bool
	away     bool
	cause    error          // why it was marked away
	gen      uint64         // counts the changes
	answered time.Time      // the last PING answered (local clock)
	changed  chan struct{}  // closed and replaced at each change
	logged   map[any]uint64 // per logger, the gen it last said a switch of
}

func (r *reach) init(h *Hub) {
	r.h = h
	r.changed = make(chan struct{})
	r.logged = make(map[any]uint64)
}

// pinger returns the probe's PING and a func that closes what it opened.
// For a *redis.Client it PINGs on a client of one connection; after a
// failure it closes that client and makes the next one only once a plain
// dial of the server's address succeeds (a refused dial through a pool
// would put go-redis's pool into failing fast for a second, with a
// goroutine left dialling each second).
func (r *reach) pinger(timeout time.Duration) (ping func(ctx context.Context) error, closeAll func()) {
	c, ok := r.h.rdb.(*redis.Client)
	if !ok {
		return func(ctx context.Context) error { return r.h.rdb.Ping(ctx).Err() }, func() {}
	}
	p := newProber(c.Options(), timeout)
	return p.ping, p.close
}

// prober is pinger's PING for a *redis.Client: a client of one connection
// with the user's options, made afresh after a failure. ping and close
// may run on different goroutines.
type prober struct {
	opts    redis.Options // every client it makes shares them
	network string        // "" when the address is none (a failover client): no plain dial
	addr    string

	mu     sync.Mutex
	client *redis.Client // nil until made, and after a failure
	closed bool
}

// newProber is a prober on the server of user's options, every call and
// dial bounded by timeout.
func newProber(user *redis.Options, timeout time.Duration) *prober {
	o := *user
	o.PoolSize, o.MinIdleConns, o.MaxIdleConns, o.MaxActiveConns = 1, 0, 1, 1
	o.MaxRetries, o.DialerRetries = -1, 1
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout = timeout, timeout, timeout, timeout
	o.ContextTimeoutEnabled = true
	// The user's maintenance-notification handlers are the user's client's:
	// a second client with the same config fails to register them again.
	o.MaintNotificationsConfig = &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
	network, addr := o.Network, o.Addr
	if network == "" {
		network = "tcp"
	}
	if _, _, err := net.SplitHostPort(addr); network == "tcp" && err != nil {
		network = "" // not an address ("FailoverClient"): no plain dial
	}
	return &prober{opts: o, network: network, addr: addr}
}

// ping PINGs Redis on the prober's client, and closes that client when
// Redis is unreachable, so that the next ping dials afresh.
func (p *prober) ping(ctx context.Context) error {
	c, err := p.conn(ctx)
	if err != nil {
		return err
	}
	err = c.Ping(ctx).Err()
	if err != nil && Unreachable(err) {
		p.mu.Lock()
		if p.client == c {
			p.client = nil
		}
		p.mu.Unlock()
		_ = c.Close()
	}
	return err
}

// conn returns the prober's client, making one, when none is open, once
// a plain dial of the server's address succeeds; redis.ErrClosed after
// close.
func (p *prober) conn(ctx context.Context) (*redis.Client, error) {
	p.mu.Lock()
	c, closed := p.client, p.closed
	p.mu.Unlock()
	if closed {
		return nil, redis.ErrClosed
	}
	if c != nil {
		return c, nil
	}
	if p.network != "" {
		var d net.Dialer
		conn, err := d.DialContext(ctx, p.network, p.addr)
		if err != nil {
			return nil, err
		}
		_ = conn.Close()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil, redis.ErrClosed
	}
	if p.client == nil {
		p.client = redis.NewClient(&p.opts)
	}
	return p.client, nil
}

// close closes the prober's client, if open; ping fails after it.
func (p *prober) close() {
	p.mu.Lock()
	c := p.client
	p.client, p.closed = nil, true
	p.mu.Unlock()
	if c != nil {
		_ = c.Close()
	}
}

// Watch counts one more handle interested in Redis's reachability and
// starts the probe if it is the first; the returned func counts it out
// (the probe stops at its next round once none is left).
func (h *Hub) Watch() (unwatch func()) {
	r := &h.reach
	r.mu.Lock()
	r.watchers++
	start := !r.running
	r.running = true
	r.mu.Unlock()
	if start && !h.group.Go(r.probe) {
		r.mu.Lock()
		r.running = false
		r.mu.Unlock()
	}
	return sync.OnceFunc(func() {
		r.mu.Lock()
		r.watchers--
		r.mu.Unlock()
	})
}

// Away reports whether Redis is marked away, and a channel closed at the
// next change either way.
func (h *Hub) Away() (bool, <-chan struct{}) {
	r := &h.reach
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.away, r.changed
}

// Answered returns when the probe last had an answer (local clock), and a
// channel closed at the next change of reachability.
func (h *Hub) Answered() (time.Time, bool, <-chan struct{}) {
	r := &h.reach
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.answered, r.away, r.changed
}

// FirstToSay reports whether logger (a handle's Config.Logger) has not yet
// said the current change of reachability: the first handle on the Hub to
// switch says it, the others stay quiet (a process with thousands of
// buckets would otherwise log thousands of lines per outage).
func (h *Hub) FirstToSay(logger any) bool {
	r := &h.reach
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.logged[logger] == r.gen {
		return false
	}
	r.logged[logger] = r.gen
	return true
}

// MarkAwayBecause marks Redis away now: a handle's call found it so, with
// err, which Cause then gives. The probe marks it back at the first
// answer; without watchers there is none, so only a watcher marks it.
func (h *Hub) MarkAwayBecause(err error) { h.reach.set(true, err) }

// Cause says why Redis was last marked away: a PING's error, or a
// handle's call's.
func (h *Hub) Cause() string {
	r := &h.reach
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cause == nil {
		return "a call found it unreachable"
	}
	return r.cause.Error()
}

func (r *reach) set(away bool, cause error) {
	r.mu.Lock()
	if r.away == away {
		r.mu.Unlock()
		return
	}
	r.away = away
	if away {
		r.cause = cause
	}
	r.gen++
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

// probe runs while some handle watches.
func (r *reach) probe(ctx context.Context) {
	t := time.NewTicker(ProbeEvery)
	defer t.Stop()
	ping, closeAll := r.pinger(AwayAfter)
	defer closeAll()
	for {
		r.mu.Lock()
		if r.watchers == 0 {
			r.running = false
			r.mu.Unlock()
			// Nobody watches: whether Redis is away is unknown from now
			// on, and the next caller tries it rather than a share.
			r.set(false, nil)
			return
		}
		r.mu.Unlock()
		pctx, cancel := context.WithTimeout(ctx, AwayAfter)
		err := ping(pctx)
		cancel()
		if ctx.Err() != nil {
			r.mu.Lock()
			r.running = false
			r.mu.Unlock()
			return
		}
		if !Unreachable(err) {
			r.mu.Lock()
			r.answered = time.Now()
			r.mu.Unlock()
		}
		if Unreachable(err) {
			r.set(true, fmt.Errorf("probe: PING: %w", err))
		} else {
			r.set(false, nil)
		}
		select {
		case <-ctx.Done():
		case <-t.C:
		}
	}
}

// Unreachable reports whether err, a failed call's, says Redis could not
// be reached or did not answer in time, rather than answering with an
// error (a refused script, READONLY, OOM: a failure to name, not a reason
// to fall back). A Redis still loading its data after a restart
// ("LOADING") counts as unreachable: it answers nothing else yet.
func Unreachable(err error) bool {
	if err == nil || errors.Is(err, redis.Nil) {
		return false
	}
	var re redis.Error
	if errors.As(err, &re) {
		return strings.HasPrefix(re.Error(), "LOADING")
	}
	return true
}

// answerProbe PINGs Redis (r.aping) once, within twice within: the call
// that ran out of within may have run out because this process was
// starved of CPU (a busy host, a pod at its CPU limit), Redis's answer
// sitting unread until the read's deadline had passed, or the PING's own
// write not made by its deadline (seen beside a busy loop: "write tcp
// ...: i/o timeout" at 1.16 s, twice in a row, in
// bucket/TestThousandsOfHandlesOneClient, 6,600 callers under -race, which
// then failed "no answer within 1s"). A PING twice as long rides out what
// starves the process that long; a Redis that does not answer is known
// within 3 × within of the call's start, the bound docs/guarantees.md
// gives, as before, when a second PING followed a late first.
func (r *reach) answerProbe(ctx context.Context, within time.Duration) error {
	pctx, cancel := context.WithTimeout(ctx, 2*within)
	defer cancel()
	sent := time.Now()
	err := r.aping(pctx)
	if err == nil {
		r.h.Replied(sent)
	}
	return err
}

// epoch is what Replied's times count from: the monotonic clock.
var epoch = time.Now()

// Replied notes that Redis answered a call of this client's that left
// this process at sent.
func (h *Hub) Replied(sent time.Time) {
	ns := max(int64(sent.Sub(epoch)), 1) // 0 is none
	for {
		cur := h.reach.replied.Load()
		if ns <= cur || h.reach.replied.CompareAndSwap(cur, ns) {
			return
		}
	}
}

// RepliedSince reports whether Redis answered a call of this client's
// that left at t or later (Replied): Redis was running after t, and a
// call of t's that ran out of its limit met a slow Redis (a queue for
// the pool, a starved process reading its replies late), not a frozen
// one.
func (h *Hub) RepliedSince(t time.Time) bool {
	v := h.reach.replied.Load()
	return v != 0 && v >= int64(t.Sub(epoch)) // 0: none yet
}

// answerFresh is how long an answered PING serves Answers: thousands of
// callers whose calls ran out together ask once.
const answerFresh = 100 * time.Millisecond

// Answers reports whether Redis answers a PING within twice within (the
// limit the call that ran out had: answerProbe says why twice): a call
// that ran out of its limit met a busy Redis, not an absent one. The PING goes
// on a connection of its own, not behind this process's queue for the
// pool (thousands of callers on a pool of 20 made a healthy Redis look
// away); concurrent callers share one PING, and an answer serves for
// 100 ms. ctx ending first reports false.
func (h *Hub) Answers(ctx context.Context, within time.Duration) bool {
	r := &h.reach
	r.amu.Lock()
	if time.Since(r.aat) < answerFresh {
		r.amu.Unlock()
		return true
	}
	if r.inflight == nil {
		if r.aping == nil {
			var closeAll func()
			r.aping, closeAll = r.pinger(2 * within)
			if !h.group.OnClose(closeAll) {
				r.amu.Unlock()
				closeAll()
				return false
			}
		}
		done := make(chan struct{})
		r.inflight = done
		if !h.group.Go(func(gctx context.Context) {
			err := r.answerProbe(gctx, within)
			r.amu.Lock()
			r.aok = !Unreachable(err)
			if r.aok {
				r.aat = time.Now()
			}
			r.inflight = nil
			r.amu.Unlock()
			close(done)
		}) {
			r.inflight = nil
			r.amu.Unlock()
			return false
		}
	}
	done := r.inflight
	r.amu.Unlock()
	select {
	case <-done:
		r.amu.Lock()
		defer r.amu.Unlock()
		return r.aok
	case <-ctx.Done():
		return false
	}
}
