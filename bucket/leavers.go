package bucket

import (
	"context"
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice/queue"
)

// leavers takes callers who gave up out of the queue, in the background.
// A caller whose ctx ended returns at once, whatever Redis is doing: its
// cancel is handed over here, and a goroutine owned by the Bucket sends the
// pending cancels in batches (a storm of 1000 cancellations costs a few
// round trips, not 1000). Until a cancel lands the scheduler may still give
// that caller a slot, which nobody collects: one token wasted, never an
// excess.
type leavers struct {
	q       *queue.Queue
	timeout time.Duration // bound on one batched cancel

	mu      sync.Mutex
	pending []string
	busy    bool
	closed  bool
	wg      sync.WaitGroup
}

// leave queues the cancel of entry (or of a bare ID).
func (l *leavers) leave(entry string) {
	l.mu.Lock()
	if l.closed {
		// After Close no goroutine may start: cancel here, bounded.
		l.mu.Unlock()
		l.send([]string{entry})
		return
	}
	l.pending = append(l.pending, entry)
	if !l.busy {
		l.busy = true
		l.wg.Add(1)
		go l.flush()
	}
	l.mu.Unlock()
}

func (l *leavers) flush() {
	defer l.wg.Done()
	for {
		l.mu.Lock()
		n := min(len(l.pending), 512)
		if n == 0 {
			l.busy = false
			l.mu.Unlock()
			return
		}
		batch := slices.Clone(l.pending[:n])
		l.pending = slices.Clone(l.pending[n:])
		l.mu.Unlock()
		l.send(batch)
	}
}

func (l *leavers) send(entries []string) {
	ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
	defer cancel()
	_, _ = l.q.CancelBatch(ctx, entries)
}

// close waits for the pending cancels to be sent (each batch bounded by
// the timeout); later leaves cancel in their caller's goroutine.
func (l *leavers) close() {
	l.mu.Lock()
	l.closed = true
	l.mu.Unlock()
	l.wg.Wait()
}
