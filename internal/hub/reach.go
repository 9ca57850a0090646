package hub

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Reachability: whether Redis answers, for the handles that fall back to a
// local share while it does not (Config.Fallback). While at least one
// handle watches, one goroutine per Hub PINGs Redis every ProbeEvery,
// each PING bounded by AwayAfter: a PING that fails or goes unanswered
// marks Redis away, and the first one answered while away marks it back.
// A handle whose own call finds Redis away says so (MarkAway), so that a
// refused connection switches every handle at once rather than at the
// next probe. Nothing runs while no handle watches.

// The probe's timing: Redis is away once a PING has gone unanswered for
// AwayAfter (or failed), found within ProbeEvery + AwayAfter of a freeze
// and within ProbeEvery of a refused connection.
const (
	ProbeEvery = 25 * time.Millisecond
	AwayAfter  = 100 * time.Millisecond
)

// reach is the Hub's reachability state.
type reach struct {
	h        *Hub
	mu       sync.Mutex
	watchers int
	running  bool
	away     bool
	changed  chan struct{}                   // closed and replaced at each change
	ping     func(ctx context.Context) error // tests replace it
}

func (r *reach) init(h *Hub) {
	r.h = h
	r.changed = make(chan struct{})
	r.ping = func(ctx context.Context) error { return h.rdb.Ping(ctx).Err() }
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

// MarkAway marks Redis away now (a handle's call found it so). The probe
// marks it back at the first answer; without watchers there is none, so
// only a watcher marks it.
func (h *Hub) MarkAway() { h.reach.set(true) }

func (r *reach) set(away bool) {
	r.mu.Lock()
	if r.away == away {
		r.mu.Unlock()
		return
	}
	r.away = away
	close(r.changed)
	r.changed = make(chan struct{})
	r.mu.Unlock()
}

// probe runs while some handle watches.
func (r *reach) probe(ctx context.Context) {
	t := time.NewTicker(ProbeEvery)
	defer t.Stop()
	for {
		r.mu.Lock()
		if r.watchers == 0 {
			r.running = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		pctx, cancel := context.WithTimeout(ctx, AwayAfter)
		err := r.ping(pctx)
		cancel()
		if ctx.Err() != nil {
			r.mu.Lock()
			r.running = false
			r.mu.Unlock()
			return
		}
		r.set(Unreachable(err))
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
