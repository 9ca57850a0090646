package bucket

import (
	"container/heap"
	"context"
	"runtime"
	"sync"
	"time"
)

// waker wakes callers at their slot with a precision Go timers lack: the
// runtime waits for timers in its network poller, with millisecond
// granularity, so a timer fires about 0.7 ms late at the median and several
// ms late at p99 on a busy machine. A Bucket's callers hand their final wait
// here; one goroutine, owned by the Bucket, keeps their deadlines in a heap,
// waits with an ordinary timer until shortly before the earliest, then
// blocks its thread in nanosleep (waker_linux.go) for the last stretch and
// closes the channel of every caller that is due.
//
// The goroutine starts when a caller waits and returns when none is left, so
// an idle Bucket runs nothing; close stops it and waits for it. A waker
// never releases a caller before its deadline. The zero value is ready to
// use; it is safe for concurrent use.
type waker struct {
	mu      sync.Mutex
	alarms  alarms
	running bool          // the goroutine is started and not yet past its last look at alarms
	closed  bool          // no goroutine may start
	kick    chan struct{} // an earlier alarm came: the goroutine re-plans (buffered, made once)
	stop    chan struct{} // closed by close
	wg      sync.WaitGroup
}

// preciseChunk bounds one nanosleep, so that an alarm set earlier than the
// one the goroutine sleeps towards is late by at most about this much.
const preciseChunk = 200 * time.Microsecond

// alarm is one caller's deadline.
type alarm struct {
	at    time.Time     // on the monotonic clock
	c     chan struct{} // closed at or after at
	fired time.Time     // when c was closed (set before closing it; for tests)
	i     int           // index in the heap; -1 once out of it
}

// sleep waits until d has passed, or ctx ends (returning ctx.Err()), or done
// is closed (ErrClosed), whichever comes first. It never returns nil
// before d has passed.
func (w *waker) sleep(ctx context.Context, d time.Duration, done <-chan struct{}) error {
	if d <= 0 {
		return nil
	}
	a := &alarm{at: time.Now().Add(d), c: make(chan struct{})}
	if !w.add(a) {
		return plainSleep(ctx, d, done) // closed: no goroutine may start
	}
	select {
	case <-a.c:
		return nil
	case <-ctx.Done():
		w.remove(a)
		return ctx.Err()
	case <-done:
		w.remove(a)
		return ErrClosed
	}
}

// plainSleep is sleep on a Go timer.
func plainSleep(ctx context.Context, d time.Duration, done <-chan struct{}) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-done:
		return ErrClosed
	}
}

// add sets a, starting the goroutine if it is not running. It reports false
// after close.
func (w *waker) add(a *alarm) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return false
	}
	if w.kick == nil {
		w.kick = make(chan struct{}, 1)
		w.stop = make(chan struct{})
	}
	heap.Push(&w.alarms, a)
	switch {
	case !w.running:
		w.running = true
		w.wg.Add(1)
		go w.run()
	case a.i == 0:
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}
	return true
}

// remove takes out the alarm of a caller that gave up. If it was the
// earliest, the goroutine re-plans (and returns when none is left).
func (w *waker) remove(a *alarm) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if a.i < 0 {
		return // fired already
	}
	head := a.i == 0
	heap.Remove(&w.alarms, a.i)
	if head {
		select {
		case w.kick <- struct{}{}:
		default:
		}
	}
}

// run fires the alarms in order until none is left or close is called.
func (w *waker) run() {
	defer w.wg.Done()
	var t *time.Timer
	defer func() {
		if t != nil {
			t.Stop()
		}
	}()
	for {
		w.mu.Lock()
		now := time.Now()
		fired := false
		for len(w.alarms) > 0 && !w.alarms[0].at.After(now) {
			a := heap.Pop(&w.alarms).(*alarm)
			a.fired = now
			close(a.c)
			fired = true
		}
		if len(w.alarms) == 0 {
			w.running = false
			w.mu.Unlock()
			return
		}
		left := w.alarms[0].at.Sub(now)
		w.mu.Unlock()
		if fired {
			// The callers just woken sit in this P's run queue; let them
			// run now rather than behind the next nanosleep, which holds
			// the P until the runtime takes it back.
			runtime.Gosched()
			continue
		}
		if left > preciseMargin {
			if t == nil {
				t = time.NewTimer(left - preciseMargin)
			} else {
				t.Reset(left - preciseMargin)
			}
			select {
			case <-t.C:
			case <-w.kick:
				t.Stop()
			case <-w.stop:
				return
			}
			continue
		}
		select {
		case <-w.stop:
			return
		default:
		}
		sleepThread(min(left, preciseChunk), left <= preciseChunk)
	}
}

// close stops the goroutine and waits for it. Callers still waiting leave
// through their done channel, which the Bucket closed first; later sleeps
// use plain timers.
func (w *waker) close() {
	w.mu.Lock()
	if !w.closed && w.stop != nil {
		close(w.stop)
	}
	w.closed = true
	w.mu.Unlock()
	w.wg.Wait()
}

// alarms is a min-heap of alarms by deadline (container/heap).
type alarms []*alarm

func (h alarms) Len() int           { return len(h) }
func (h alarms) Less(i, j int) bool { return h[i].at.Before(h[j].at) }
func (h alarms) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].i = i
	h[j].i = j
}

func (h *alarms) Push(x any) {
	a := x.(*alarm)
	a.i = len(*h)
	*h = append(*h, a)
}

func (h *alarms) Pop() any {
	old := *h
	a := old[len(old)-1]
	old[len(old)-1] = nil
	a.i = -1
	*h = old[:len(old)-1]
	return a
}
