package hub

import (
	"context"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Stops: whether this process was stopped lately. A pod at its CPU limit
// runs a few ms of every 100 and is stopped (throttled) the rest, all its
// threads at once; a frozen VM or a process starved of CPU does the same
// at longer intervals. While it is stopped, the slots of its callers come
// and go unused, and the tokens of other processes' slots wait for
// someone to run. A handle that shares its buckets with other processes
// watches for the stops (WatchStops): while some handle watches, one
// goroutine of the Hub ticks every stopTick, and a tick later than
// stopGap says that the process was stopped in between (the kernel ran
// none of its threads). Each tick then calls one watcher, in turn, so
// that a process of thousands of buckets calls one a tick, not all; a
// call that lasts longer than stopGap says so too (a watcher must not
// block: it took that long because the process was stopped during it).

const (
	// stopTick is how often the watch ticks.
	stopTick = 5 * time.Millisecond
	// stopGap is how late a tick must come, or how long a watcher's
	// call must last, to count as a stop: Go's timers fire about 1 ms
	// late on a busy machine, a pod at its CPU limit stops for 75 ms of
	// every 100.
	stopGap = 10 * time.Millisecond
	// StoppedLately is how long after a stop the process counts as one
	// that stops (Stopped): a pod stops once a CFS period (100 ms).
	StoppedLately = 200 * time.Millisecond
)

// Watcher is called at a tick while it watches: since is how long ago
// the process was last found stopped (a large duration when never). It
// returns false to watch no longer. It must not block.
type Watcher func(since time.Duration) (keep bool)

// watch is one watcher.
type watch struct{ fn Watcher }

type stops struct {
	h        *Hub
	mu       sync.Mutex
	watchers []*watch
	next     int  // the watcher the next tick calls
	running  bool // the ticking goroutine is started and not yet past its last look
	last     atomic.Int64
}

// WatchStops has w called at ticks, one watcher a tick in turn, until it
// returns false or the Hub closes.
func (h *Hub) WatchStops(w Watcher) {
	s := &h.stops
	s.mu.Lock()
	defer s.mu.Unlock()
	s.watchers = append(s.watchers, &watch{fn: w})
	if !s.running && h.group.Go(s.tick) {
		s.running = true
	}
}

// Stopped reports whether the process was found stopped in the last
// StoppedLately (only while some handle watches).
func (h *Hub) Stopped() bool { return h.stops.since() < StoppedLately }

// since is how long ago the process was last found stopped (the largest
// duration when never).
func (s *stops) since() time.Duration {
	last := s.last.Load()
	if last == 0 {
		return math.MaxInt64
	}
	return time.Duration(time.Now().UnixNano() - last)
}

// tick runs while some watcher is left.
func (s *stops) tick(ctx context.Context) {
	t := time.NewTimer(stopTick)
	defer t.Stop()
	// Every instant of the loop lies between two readings of the clock,
	// each compared with the one before: a stop that begins while a
	// watcher runs (after the tick's reading, before the timer is set
	// again) is seen at the reading after the call, not missed.
	read := time.Now()
	look := func(allowed time.Duration) {
		now := time.Now()
		if now.Sub(read) > allowed {
			s.last.Store(now.UnixNano())
		}
		read = now
	}
	for {
		select {
		case <-ctx.Done():
			s.mu.Lock()
			s.running, s.watchers = false, nil
			s.mu.Unlock()
			return
		case <-t.C:
			look(stopTick + stopGap)
			if !s.call() {
				return
			}
			look(stopGap)
			t.Reset(stopTick)
		}
	}
}

// call calls the next watcher, dropping it if it is done. It reports
// whether any watcher is left (if not, the ticking ends).
func (s *stops) call() bool {
	s.mu.Lock()
	if len(s.watchers) == 0 {
		s.running = false
		s.mu.Unlock()
		return false
	}
	s.next %= len(s.watchers)
	w := s.watchers[s.next]
	s.mu.Unlock()
	keep := w.fn(s.since())
	s.mu.Lock()
	defer s.mu.Unlock()
	switch i := slices.Index(s.watchers, w); {
	case keep:
		s.next++
	case i >= 0: // others may have joined meanwhile: found again
		s.watchers = slices.Delete(s.watchers, i, i+1)
	}
	if len(s.watchers) == 0 {
		s.running = false
		return false
	}
	return true
}
