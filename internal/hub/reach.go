package hub

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// Reachability: whether Redis answers, for the handles that fall back to a
// local share while it does not (Config.Fallback). While at least one
// handle watches, one goroutine per Hub PINGs Redis every ProbeEvery,
// each PING bounded by AwayAfter: a PING that fails or goes unanswered
// marks Redis away, and the first one answered while away marks it back.
// A handle whose own call finds Redis away says so (MarkAway), so that a
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
func (r *reach) pinger() (ping func(ctx context.Context) error, closeAll func()) {
	c, ok := r.h.rdb.(*redis.Client)
	if !ok {
		return func(ctx context.Context) error { return r.h.rdb.Ping(ctx).Err() }, func() {}
	}
	o := *c.Options()
	o.PoolSize, o.MinIdleConns, o.MaxIdleConns, o.MaxActiveConns = 1, 0, 1, 1
	o.MaxRetries, o.DialerRetries = -1, 1
	o.DialTimeout, o.ReadTimeout, o.WriteTimeout, o.PoolTimeout = AwayAfter, AwayAfter, AwayAfter, AwayAfter
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
	var probe *redis.Client
	return func(ctx context.Context) error {
			if probe == nil && network != "" {
				var d net.Dialer
				conn, err := d.DialContext(ctx, network, addr)
				if err != nil {
					return err
				}
				_ = conn.Close()
			}
			if probe == nil {
				probe = redis.NewClient(&o)
			}
			err := probe.Ping(ctx).Err()
			if err != nil && Unreachable(err) {
				_ = probe.Close()
				probe = nil
			}
			return err
		}, func() {
			if probe != nil {
				_ = probe.Close()
			}
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

// MarkAway marks Redis away now (a handle's call found it so). The probe
// marks it back at the first answer; without watchers there is none, so
// only a watcher marks it.
func (h *Hub) MarkAway() { h.reach.set(true, nil) }

// MarkAwayBecause is MarkAway with the failed call's error, which Cause
// then gives.
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
	ping, closeAll := r.pinger()
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
