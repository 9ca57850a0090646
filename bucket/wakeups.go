package bucket

import (
	"context"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// wakeups wakes queued callers whose slot came earlier than the estimate
// they sleep on (callers ahead of them cancelled or timed out). The
// scheduler's step publishes such entries on the bucket's wake channel; this
// Bucket subscribes once it has a queued caller, and pokes the matching
// local waiter, which then polls at once. A lost message costs only time:
// the caller still polls at its estimate.
type wakeups struct {
	rdb     redis.UniversalClient
	channel string

	mu      sync.Mutex
	waiters map[string]chan struct{}
	ps      *redis.PubSub // nil until the first waiter; closed by close
	closed  bool
	wg      sync.WaitGroup
}

// register returns the channel that wakes the caller queued as entry, and
// the function that forgets it.
func (w *wakeups) register(entry string) (<-chan struct{}, func()) {
	c := make(chan struct{}, 1)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return c, func() {}
	}
	if w.waiters == nil {
		w.waiters = make(map[string]chan struct{})
	}
	w.waiters[entry] = c
	if w.ps == nil {
		// Subscribe returns at once; messages published before Redis
		// confirms the subscription are lost, which only costs time.
		w.ps = w.rdb.Subscribe(context.Background(), w.channel)
		w.wg.Add(1)
		go w.dispatch(w.ps.Channel())
	}
	return c, func() {
		w.mu.Lock()
		delete(w.waiters, entry)
		w.mu.Unlock()
	}
}

// dispatch pokes the waiters named in each message until the subscription
// closes.
func (w *wakeups) dispatch(msgs <-chan *redis.Message) {
	defer w.wg.Done()
	for m := range msgs {
		w.mu.Lock()
		for _, entry := range strings.Fields(m.Payload) {
			if c, ok := w.waiters[entry]; ok {
				select {
				case c <- struct{}{}:
				default:
				}
			}
		}
		w.mu.Unlock()
	}
}

// close ends the subscription and waits for dispatch to return.
func (w *wakeups) close() {
	w.mu.Lock()
	w.closed = true
	ps := w.ps
	w.mu.Unlock()
	if ps != nil {
		_ = ps.Close()
	}
	w.wg.Wait()
}
