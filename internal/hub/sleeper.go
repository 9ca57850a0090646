package hub

import (
	"container/heap"
	"context"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/background"
)

// sleeper wakes callers at their slot with a precision Go timers lack: the
// runtime waits for timers in its network poller, with millisecond
// granularity, so a timer fires about 0.7 ms late at the median and several
// ms late at p99 on a busy machine. The callers of every bucket on a Hub hand
// their final wait here; one goroutine, owned by the Hub, keeps their deadlines in a heap
// and waits for the earliest on a kernel timer (a timerfd on Linux,
// sleeper_linux.go) read through the runtime's poller: the goroutine parks,
// holding no thread and no P, and the poller returns as soon as the
// kernel timer fires, without the millisecond rounding. Then it closes the
// channel of every caller that is due.
//
// (A thread blocked in nanosleep would be as precise, but it keeps its P
// until the runtime's sysmon takes it back, which can take up to 10 ms:
// with GOMAXPROCS 2 that starved the semaphore's benchmark of CPU, see
// docs/semaphore.md.)
//
// The goroutine starts when a caller waits and returns when none is left, so
// an idle Hub runs nothing; it belongs to the Hub's group, whose Close
// stops it. A sleeper never releases a caller before its deadline. It is
// safe for concurrent use.
type sleeper struct {
	group *background.Group

	mu      sync.Mutex
	alarms  deadlines[*alarm]
	running bool // the goroutine is started and not yet past its last look at alarms
	clock   *kernelTimer
}

// alarm is one caller's deadline.
type alarm struct {
	at    time.Time     // on the monotonic clock
	c     chan struct{} // closed at or after at
	fired time.Time     // when c was closed (set before closing it; for tests)
	i     int           // index in the heap; -1 once out of it
}

// sleep waits until d has passed, or ctx ends (returning ctx.Err()), or done
// is closed (ErrStopped), whichever comes first. It never returns nil
// before d has passed.
func (w *sleeper) sleep(ctx context.Context, d time.Duration, done <-chan struct{}) error {
	if d <= 0 {
		return nil
	}
	a := &alarm{at: time.Now().Add(d), c: make(chan struct{})}
	if !w.add(a) {
		return plainSleep(ctx, d, done) // closed: no goroutine may start
	}
	// A Go timer for the same deadline too: the runtime runs timers at
	// every scheduling point, so when this process's Ps are all busy it
	// fires before the poller (which a busy process checks only when a P
	// runs out of work, or on sysmon's tick) notices the kernel timer.
	// Whichever comes first; neither before the deadline.
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-a.c:
		return nil
	case <-t.C:
		w.remove(a)
		return nil
	case <-ctx.Done():
		w.remove(a)
		return ctx.Err()
	case <-done:
		w.remove(a)
		return ErrStopped
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
		return ErrStopped
	}
}

// add sets a, starting the goroutine if it is not running. It reports false
// once the group is closed, or when no kernel timer can be had (the caller
// then sleeps on a Go timer).
func (w *sleeper) add(a *alarm) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.clock == nil {
		c, err := newKernelTimer()
		if err != nil {
			return false
		}
		// The group's end wakes the goroutine, if one runs (it sees its
		// ctx ended and closes the timer), or closes the timer.
		if !w.group.OnClose(w.stop) {
			c.close()
			return false
		}
		w.clock = c
	}
	if !w.running {
		if !w.group.Go(w.run) {
			return false
		}
		w.running = true
		heap.Push(&w.alarms, a)
		return true
	}
	heap.Push(&w.alarms, a)
	if a.i == 0 {
		// Earlier than what the goroutine waits for: bring the timer
		// forward; the goroutine's read returns then.
		w.clock.arm(time.Until(a.at))
	}
	return true
}

// stop runs when the group closes.
func (w *sleeper) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.running:
		w.clock.arm(0)
	case w.clock != nil:
		w.clock.close()
		w.clock = nil
	}
}

// remove takes out the alarm of a caller that gave up. The goroutine may
// then wake for nothing, and re-arms for the next alarm.
func (w *sleeper) remove(a *alarm) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if a.i < 0 {
		return // fired already
	}
	heap.Remove(&w.alarms, a.i)
}

// run fires the alarms in order until none is left or the group closes
// (ctx ends); then it closes the kernel timer. The timer is armed under mu,
// by run for the earliest alarm and by add for an earlier one, so it always
// holds the earliest deadline; a wait that begins after the timer fired
// returns at once.
func (w *sleeper) run(ctx context.Context) {
	for {
		w.mu.Lock()
		if ctx.Err() != nil {
			w.running = false
			w.clock.close()
			w.clock = nil
			w.mu.Unlock()
			return
		}
		now := time.Now()
		for len(w.alarms) > 0 && !w.alarms[0].at.After(now) {
			a := heap.Pop(&w.alarms).(*alarm)
			a.fired = now
			close(a.c)
		}
		if len(w.alarms) == 0 {
			w.running = false
			w.mu.Unlock()
			return
		}
		w.clock.arm(w.alarms[0].at.Sub(now))
		w.mu.Unlock()
		w.clock.wait()
	}
}

func (a *alarm) deadline() time.Time { return a.at }
func (a *alarm) setIndex(i int)      { a.i = i }
