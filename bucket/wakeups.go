package bucket

import (
	"context"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
)

// wakeups tells queued callers their slot when it is not the estimate they
// sleep on: callers ahead of them cancelled or timed out, or they were
// pushed without an estimate (queue/push.go). The scheduler's step
// publishes such entries with their slots on the bucket's wake channel
// ("entry slot entry slot ..."); this Bucket subscribes once it has a
// queued caller, and hands the matching local waiter its slot, before
// which it then polls. A lost message costs only time: the caller still
// polls at its estimate.
type wakeups struct {
	rdb     redis.UniversalClient
	channel string

	mu      sync.Mutex
	waiters map[string]chan int64
	ps      *redis.PubSub // nil until the first waiter; closed by close
	closed  bool
	wg      sync.WaitGroup
}

// register returns the channel that gives the caller queued as entry its
// slot (µs, Redis clock), and the function that forgets it.
func (w *wakeups) register(entry string) (<-chan int64, func()) {
	c := make(chan int64, 1)
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return c, func() {}
	}
	if w.waiters == nil {
		w.waiters = make(map[string]chan int64)
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

// dispatch hands the waiters named in each message their slots until the
// subscription closes.
func (w *wakeups) dispatch(msgs <-chan *redis.Message) {
	defer w.wg.Done()
	for m := range msgs {
		f := strings.Fields(m.Payload)
		w.mu.Lock()
		for i := 0; i+1 < len(f); i += 2 {
			c, ok := w.waiters[f[i]]
			if !ok {
				continue
			}
			slot, err := strconv.ParseInt(f[i+1], 10, 64)
			if err != nil || slot <= 0 {
				slot = 1 // unreadable: poll at once
			}
			select {
			case c <- slot:
			default:
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
