package bucket

import (
	"container/heap"
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
	waiters map[string]waiter
	// byTicket orders the waiters for poke, earliest ticket first. A
	// waiter forgotten stays in it until a poke pops it, or until the
	// heap holds twice as many as there are waiters (remove rebuilds it).
	byTicket tickets
	stop     func() // stops listening; nil while not listening
	closed   bool
}

// waiter is a queued caller of this process: its ticket orders it among
// the others, c gives it its slot.
type waiter struct {
	ticket int64
	c      chan int64
	poked  bool // a poke has had it poll (pokeFresh passes it over)
}

// ticketed is a waiter's place in notices.byTicket.
type ticketed struct {
	ticket int64
	entry  string
}

// tickets is a min-heap of ticketed (container/heap), earliest first.
type tickets []ticketed

func (h tickets) Len() int           { return len(h) }
func (h tickets) Less(i, j int) bool { return h[i].ticket < h[j].ticket }
func (h tickets) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *tickets) Push(x any)        { *h = append(*h, x.(ticketed)) }
func (h *tickets) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// pollNow is the slot a poke gives (see poke): long past, so that the
// caller polls at once, and through the script (which claims); 1 is an
// unreadable slot's (poll at once).
const pollNow = 2

// register returns the channel that gives the caller queued as entry
// (with its ticket) its slot (µs, Redis clock), and the function that
// forgets it.
func (n *notices) register(entry string, ticket int64) (<-chan int64, func()) {
	c := make(chan int64, 1)
	n.mu.Lock()
	defer n.mu.Unlock()
	n.add(entry, waiter{ticket: ticket, c: c})
	if n.stop == nil && !n.closed {
		n.stop = n.hub.Listen(n.channel, n.deliver, nil)
	}
	return c, func() {
		n.mu.Lock()
		defer n.mu.Unlock()
		n.remove(entry)
		if len(n.waiters) == 0 && n.stop != nil {
			n.stop()
			n.stop = nil
		}
	}
}

// add registers w as entry's waiter (n.mu held).
func (n *notices) add(entry string, w waiter) {
	if n.waiters == nil {
		n.waiters = make(map[string]waiter)
	}
	n.waiters[entry] = w
	heap.Push(&n.byTicket, ticketed{w.ticket, entry})
}

// remove forgets entry's waiter (n.mu held); byTicket is made again
// once it holds more than twice as many as there are waiters. The last
// waiter gone, both go, so that an idle bucket keeps neither (a map
// never shrinks; byTicket holds forgotten entries' IDs).
func (n *notices) remove(entry string) {
	delete(n.waiters, entry)
	switch {
	case len(n.waiters) == 0:
		n.waiters, n.byTicket = nil, nil
	case len(n.byTicket) > 2*len(n.waiters)+64:
		n.rebuild()
	}
}

// rebuild makes byTicket again from the waiters alone, leaving out the
// forgotten ones (n.mu held).
func (n *notices) rebuild() {
	n.byTicket = n.byTicket[:0]
	for entry, w := range n.waiters {
		n.byTicket = append(n.byTicket, ticketed{w.ticket, entry})
	}
	heap.Init(&n.byTicket)
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
		if w, ok := n.waiters[entry]; ok {
			select {
			case w.c <- slot:
			default:
			}
		}
	})
}

// poke has the earliest queued caller of this process that has no word
// pending poll at once: a caller of this process found slots whose
// callers did not come for them (their processes stopped), and a queued
// caller that polls takes one (claim.lua), starting now. It says whether
// it found one to poke.
//
// It takes waiters off byTicket, earliest first, until one has no word
// pending, dropping the forgotten ones; those it passed over, and the one
// it poked, go back: a poke costs O(log n) for the n waiters, plus those
// passed over, not a walk over all of them (thousands of callers of one
// process queued in a bucket that other processes share).
func (n *notices) poke() bool { return n.pokeWith(false) }

// pokeFresh pokes as poke does, but passes over the waiters a poke has
// had poll already: each queued caller polls at most once for pokeFresh
// (the stop watch's ticks, onTick), however many ticks find its process
// stopped.
func (n *notices) pokeFresh() bool { return n.pokeWith(true) }

func (n *notices) pokeWith(fresh bool) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	var kept []ticketed
	defer func() {
		for _, t := range kept {
			heap.Push(&n.byTicket, t)
		}
	}()
	for n.byTicket.Len() > 0 {
		t := heap.Pop(&n.byTicket).(ticketed)
		w, ok := n.waiters[t.entry]
		if !ok || w.ticket != t.ticket {
			continue // forgotten (or registered again, with its own place)
		}
		kept = append(kept, t)
		if fresh && w.poked {
			continue
		}
		select {
		case w.c <- pollNow:
			w.poked = true
			n.waiters[t.entry] = w
			return true
		default: // a word pending: it polls soon anyway
		}
	}
	return false
}
