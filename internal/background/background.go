// Package background is how a limiter runs work behind its callers' backs:
// a Group owns the goroutines and stops them all one way (Close cancels the
// group's context and waits for every one), and a Batcher sends what
// concurrent callers hand in together, one batch at a time, so a burst of
// callers costs Redis a few round trips instead of one each.
package background

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Group owns goroutines. Go starts one unless the group is closed; Close
// cancels the context every goroutine gets and waits for them all, so none
// outlives the group's owner. The zero value is not usable; call NewGroup.
// A Group is safe for concurrent use.
type Group struct {
	ctx    context.Context
	cancel context.CancelFunc

	mu     sync.Mutex
	closed bool
	hooks  []func()
	wg     sync.WaitGroup
}

// NewGroup returns an open Group.
func NewGroup() *Group {
	ctx, cancel := context.WithCancel(context.Background())
	return &Group{ctx: ctx, cancel: cancel}
}

// Go runs f in a goroutine owned by the group, with a ctx that ends at
// Close. It reports false, and runs nothing, once Close has begun.
func (g *Group) Go(f func(ctx context.Context)) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		f(g.ctx)
	}()
	return true
}

// OnClose registers f to run in Close, after the group's ctx ends and
// before Close waits for the goroutines: it wakes a goroutine that waits
// on something other than the ctx (a socket, a kernel timer). It reports
// false, and registers nothing, once Close has begun.
func (g *Group) OnClose(f func()) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return false
	}
	g.hooks = append(g.hooks, f)
	return true
}

// Done is closed when Close begins.
func (g *Group) Done() <-chan struct{} { return g.ctx.Done() }

// Close cancels the group's ctx and waits for every goroutine it started.
// It is safe to call more than once.
func (g *Group) Close() {
	g.mu.Lock()
	g.closed = true
	hooks := g.hooks
	g.hooks = nil
	g.mu.Unlock()
	g.cancel()
	for _, f := range hooks {
		f()
	}
	g.wg.Wait()
}

// Batcher gathers the items that callers hand in while a send is in flight
// and sends them together, in the order they came, at most Max at a time,
// from one goroutine of its Group that runs while anything is pending. A
// caller that finds nothing in flight may send its own item at once, on its
// own ctx (Claim, Release), so an uncontended call costs one round trip and
// no goroutine. A Batcher is safe for concurrent use.
type Batcher[T comparable] struct {
	group *Group
	send  func(ctx context.Context, items []T)
	max   int
	// timeout bounds one send. detach makes sends outlive the group's
	// ctx: Close then waits for what is pending to be sent (each send
	// bounded by timeout) instead of cutting it short.
	timeout time.Duration
	detach  bool

	mu      sync.Mutex
	busy    bool // a send is in flight, inline or the flusher's
	pending []T
}

// BatcherConfig describes a Batcher.
type BatcherConfig[T any] struct {
	Send    func(ctx context.Context, items []T) // sends one batch; its ctx is bounded by Timeout
	Max     int                                  // most items in one batch
	Timeout time.Duration                        // bound on one send
	// Drain: on Close, what is pending is still sent, each batch bounded
	// by Timeout, and items added after Close are sent at once by the
	// caller of Add. Otherwise Close cuts the sends short (their ctx
	// ends) and pending items are sent on an ended ctx, failing at once.
	Drain bool
}

// NewBatcher returns a Batcher whose goroutine belongs to g.
func NewBatcher[T comparable](g *Group, c BatcherConfig[T]) *Batcher[T] {
	return &Batcher[T]{group: g, send: c.Send, max: c.Max, timeout: c.Timeout, detach: c.Drain}
}

// Busy reports whether a send is in flight or items wait for one.
func (b *Batcher[T]) Busy() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.busy || len(b.pending) > 0
}

// Claim reports whether nothing is in flight; then the caller sends its
// own item at once and must call Release when its send returns.
func (b *Batcher[T]) Claim() bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.busy {
		return false
	}
	b.busy = true
	return true
}

// Release ends a send made after Claim: what was handed in meanwhile goes
// out in the next batches.
func (b *Batcher[T]) Release() {
	b.mu.Lock()
	if len(b.pending) == 0 {
		b.busy = false
		b.mu.Unlock()
		return
	}
	b.mu.Unlock()
	b.start()
}

// Add hands item in: it goes out with the next batch. After the group's
// Close, the caller sends it itself (see BatcherConfig.Drain).
func (b *Batcher[T]) Add(item T) {
	b.mu.Lock()
	b.pending = append(b.pending, item)
	if b.busy {
		b.mu.Unlock()
		return
	}
	b.busy = true
	b.mu.Unlock()
	b.start()
}

// Withdraw takes item back if it is still pending, and reports whether it
// was; false means it is in a batch already sent or in flight.
func (b *Batcher[T]) Withdraw(item T) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	i := slices.Index(b.pending, item)
	if i < 0 {
		return false
	}
	b.pending = slices.Delete(b.pending, i, i+1)
	return true
}

// start runs the flusher in the group, or here once the group is closed.
func (b *Batcher[T]) start() {
	if !b.group.Go(b.flush) {
		b.flush(b.group.ctx)
	}
}

// flush sends the pending items in batches until none is left.
func (b *Batcher[T]) flush(ctx context.Context) {
	if b.detach {
		ctx = context.WithoutCancel(ctx)
	}
	for {
		b.mu.Lock()
		n := min(len(b.pending), b.max)
		if n == 0 {
			b.busy = false
			b.mu.Unlock()
			return
		}
		items := slices.Clone(b.pending[:n])
		b.pending = slices.Delete(b.pending, 0, n)
		b.mu.Unlock()
		sctx, cancel := context.WithTimeout(ctx, b.timeout)
		b.send(sctx, items)
		cancel()
	}
}
