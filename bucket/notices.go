package bucket

import (
	"context"
	"sync"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/background"
	"github.com/sluicehq/sluice/internal/protocol"
)

// notices tells queued callers their slot when it is not the estimate they
// sleep on: callers ahead of them cancelled or timed out, or they were
// pushed without an estimate (queue/push.go). The scheduler's step
// publishes such entries with their slots on the bucket's wake channel (a
// wake message, internal/protocol/wake.go); this Bucket subscribes once it
// has a queued caller, and hands the matching local waiter its slot, before
// which it then polls. A lost message costs only time: the caller still
// polls at its estimate.
type notices struct {
	rdb     redis.UniversalClient
	channel string
	group   *background.Group
	// changed is told the id of the configuration a live change put in
	// force (a message "config <id>" on the channel: change.lua).
	changed func(id string)

	mu      sync.Mutex
	waiters map[string]chan int64
	ps      *redis.PubSub // nil until the first waiter; closed when the group closes
}

// register returns the channel that gives the caller queued as entry its
// slot (µs, Redis clock), and the function that forgets it.
func (n *notices) register(entry string) (<-chan int64, func()) {
	c := make(chan int64, 1)
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.waiters == nil {
		n.waiters = make(map[string]chan int64)
	}
	n.waiters[entry] = c
	if n.ps == nil {
		// Subscribe returns at once; messages published before Redis
		// confirms the subscription are lost, which only costs time.
		ps := n.rdb.Subscribe(context.Background(), n.channel)
		closeSub := func() { _ = ps.Close() }
		if !n.group.OnClose(closeSub) || !n.group.Go(func(context.Context) { n.dispatch(ps) }) {
			closeSub() // closed: the caller waits on its estimate
		} else {
			n.ps = ps
		}
	}
	return c, func() {
		n.mu.Lock()
		delete(n.waiters, entry)
		n.mu.Unlock()
	}
}

// dispatch hands the waiters named in each message their slots until the
// group closes, which closes the subscription.
func (n *notices) dispatch(ps *redis.PubSub) {
	for m := range ps.Channel() {
		n.deliver(m.Payload)
	}
}

// deliver hands the waiters named in a wake message their slots.
func (n *notices) deliver(payload string) {
	if id, ok := protocol.ConfigNotice(payload); ok {
		if n.changed != nil {
			n.changed(id)
		}
		return
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	protocol.ParseWake(payload, func(entry string, slot int64) {
		if c, ok := n.waiters[entry]; ok {
			select {
			case c <- slot:
			default:
			}
		}
	})
}
