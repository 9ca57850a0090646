package bucket

import (
	"sync"

	"github.com/sluicehq/sluice/internal/hub"
	"github.com/sluicehq/sluice/internal/protocol"
)

// notices tells queued callers their slot when it is not the estimate they
// sleep on: callers ahead of them cancelled or timed out, or they were
// pushed without an estimate (queue/push.go). The scheduler's step
// publishes such entries with their slots on the bucket's wake channel (a
// wake message, internal/protocol/wake.go); while this Bucket has a queued
// caller it listens there, on the Pub/Sub connection its Redis client's
// hub shares with every other handle, and hands the matching local waiter
// its slot, before which it then polls. A lost message costs only time:
// the caller still polls at its estimate. With no caller queued the
// Bucket listens to nothing.
type notices struct {
	hub     *hub.Hub
	channel string
	// changed is told the id of the configuration a live change put in
	// force (a message "config <id>" on the channel: change.lua).
	changed func(id string)
	// handover is told that a process released the scheduler lock while
	// callers may wait (protocol.HandoverNotice).
	handover func()

	mu      sync.Mutex
	waiters map[string]chan int64
	stop    func() // stops listening; nil while not listening
	closed  bool
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
	if n.stop == nil && !n.closed {
		n.stop = n.hub.Listen(n.channel, n.deliver, nil)
	}
	return c, func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		delete(n.waiters, entry)
		if len(n.waiters) == 0 && n.stop != nil {
			n.stop()
			n.stop = nil
		}
	}
}

// close stops listening for good.
func (n *notices) close() {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.closed = true
	if n.stop != nil {
		n.stop()
		n.stop = nil
	}
}

// deliver hands the waiters named in a wake message their slots. It runs
// on the hub's reader and never blocks.
func (n *notices) deliver(payload string) {
	if payload == protocol.HandoverNotice {
		if n.handover != nil {
			n.handover()
		}
		return
	}
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
