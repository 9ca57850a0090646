// Package hub is what a process runs for every bucket and semaphore made on
// one Redis client: one Pub/Sub connection (pubsub.go), one precise timer
// for callers' final waits (sleeper.go) and one loop that runs the timed
// jobs of every handle, such as the scheduler steps of each bucket whose
// lock this process holds (jobs.go). Thousands of handles on one client
// share them; an idle handle costs no goroutine, no connection and no
// Redis command of its own, because each part runs a goroutine only while
// it has work.
//
// Handles take a Hub with Acquire and give it back with Release; the Hub
// of a client ends when its last handle releases it (its goroutines are
// then stopped and waited for, and its Pub/Sub connection closed), and a
// later Acquire on the same client makes a new one.
package hub

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/background"
)

// ErrStopped is returned by Sleep when its done channel closes first.
var ErrStopped = errors.New("hub: stopped")

// Hub is the shared runtime of one Redis client. It is safe for concurrent
// use.
type Hub struct {
	rdb   redis.UniversalClient
	group *background.Group
	refs  int // guarded by registry.mu

	sleeper sleeper
	subs    subscriptions
	jobs    jobs
	pipe    pipe
	reach   reach
	stops   stops
}

// registry holds the live Hub of each client.
var registry struct {
	mu   sync.Mutex
	hubs map[redis.UniversalClient]*Hub
}

// Acquire returns the Hub of rdb, making it if none is live, and counts one
// more handle on it. Each Acquire must be matched by one Release. It does
// no I/O and starts no goroutine.
func Acquire(rdb redis.UniversalClient) *Hub {
	if c, ok := rdb.(*Client); ok {
		rdb = c.UniversalClient
	}
	registry.mu.Lock()
	defer registry.mu.Unlock()
	if registry.hubs == nil {
		registry.hubs = make(map[redis.UniversalClient]*Hub)
	}
	h := registry.hubs[rdb]
	if h == nil {
		h = newHub(rdb)
		registry.hubs[rdb] = h
	}
	h.refs++
	return h
}

func newHub(rdb redis.UniversalClient) *Hub {
	h := &Hub{rdb: rdb, group: background.NewGroup()}
	h.sleeper.group = h.group
	h.subs.init(h)
	h.jobs.init(h)
	h.pipe.h = h
	h.reach.init(h)
	h.stops.h = h
	return h
}

// Release counts one handle fewer on h. The last one stops h's goroutines,
// waits for them and closes its Pub/Sub connection; h must not be used
// after its last Release.
func (h *Hub) Release() {
	registry.mu.Lock()
	h.refs--
	last := h.refs == 0
	if last && registry.hubs[h.rdb] == h {
		delete(registry.hubs, h.rdb)
	}
	registry.mu.Unlock()
	if last {
		h.group.Close()
	}
}

// Client is the Redis client h serves.
func (h *Hub) Client() redis.UniversalClient { return h.rdb }

// Sleep waits until d has passed (never returning nil before), or ctx ends
// (returning ctx.Err()), or done closes (ErrStopped), on a kernel timer
// shared by every handle of h: see sleeper.go.
func (h *Hub) Sleep(ctx context.Context, d time.Duration, done <-chan struct{}) error {
	return h.sleeper.sleep(ctx, d, done)
}

// Live reports how many Hubs are live, for tests.
func Live() int {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	return len(registry.hubs)
}
