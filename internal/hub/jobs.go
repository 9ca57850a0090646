package hub

import (
	"container/heap"
	"context"
	"sync"
	"time"
)

// Jobs: timed work of every handle of a Hub (each bucket's scheduler, while
// this process holds its lock) runs from one loop. The loop keeps the jobs
// due in a heap by time, and runs each due job on a goroutine of its own,
// at most maxWorkers at once. A job's run is a Redis round trip or two,
// made through the Hub's pipelining (pipe.go): when a thousand buckets'
// steps fall due together, their runs wait there and go out in a few
// shared pipelines, so the workers bound the goroutines, not the round
// trips. The loop runs while a job is due or running and ends when none
// is, so an idle Hub runs nothing.

// maxWorkers bounds the runs in flight. Far above the pipelining's sends
// in flight, so that steps due together share pipelines (with 8 workers,
// 2,000 buckets' steps went out 8 round trips at a time, and callers
// polled 5 times each waiting for their slots).
const maxWorkers = 256

// Job is one handle's timed work. Its function runs at most once at a
// time, on the Hub's loop; it returns when to run again (more) or that
// it is done until the next Schedule. Safe for concurrent use.
type Job struct {
	js  *jobs
	run func(ctx context.Context) (next time.Duration, more bool)

	// guarded by jobs.mu
	at      time.Time
	index   int // in the heap; -1 when not in it
	running bool
	again   bool      // Schedule was called while it ran
	againAt time.Time // then: when to run again at the latest
	stopped bool
	done    chan struct{}      // while running: closed when the run ends
	cancel  context.CancelFunc // while running: ends the run's ctx (Stop)
}

type jobs struct {
	h *Hub

	mu      sync.Mutex
	due     deadlines[*Job]
	looping bool
	kick    chan struct{}
	workers chan struct{}
}

func (js *jobs) init(h *Hub) {
	js.h = h
	js.kick = make(chan struct{}, 1)
	js.workers = make(chan struct{}, maxWorkers)
}

// NewJob returns a job that runs run on h's loop once scheduled. run gets
// a ctx that ends when the Hub closes.
func (h *Hub) NewJob(run func(ctx context.Context) (next time.Duration, more bool)) *Job {
	return &Job{js: &h.jobs, run: run, index: -1}
}

// Schedule makes j run within d: at once for d ≤ 0. A job already due
// earlier keeps its time; one running now runs again when it ends, within
// d. It never blocks; after Stop it does nothing.
func (j *Job) Schedule(d time.Duration) {
	js := j.js
	at := time.Now().Add(d)
	js.mu.Lock()
	defer js.mu.Unlock()
	switch {
	case j.stopped:
	case j.running:
		if !j.again || at.Before(j.againAt) {
			j.againAt = at
		}
		j.again = true
	case j.index >= 0:
		if at.Before(j.at) {
			j.at = at
			heap.Fix(&js.due, j.index)
			js.wake()
		}
	default:
		j.at = at
		heap.Push(&js.due, j)
		js.wake()
	}
}

// Stop takes j off the loop and waits for a run in flight to end. Later
// Schedule calls do nothing. It must not be called from j's own run.
func (j *Job) Stop() {
	js := j.js
	js.mu.Lock()
	j.stopped = true
	if j.index >= 0 {
		heap.Remove(&js.due, j.index)
	}
	done := j.done
	running := j.running
	if running && j.cancel != nil {
		j.cancel() // a run waiting on Redis returns now
	}
	js.mu.Unlock()
	if running {
		<-done
	}
}

// wake starts the loop, or wakes it to look at an earlier job. Called with
// mu held.
func (js *jobs) wake() {
	if js.looping {
		select {
		case js.kick <- struct{}{}:
		default:
		}
		return
	}
	if js.h.group.Go(js.loop) {
		js.looping = true
	}
}

// loop runs due jobs until none is left in the heap, or the Hub closes.
func (js *jobs) loop(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	for {
		js.mu.Lock()
		if ctx.Err() != nil || len(js.due) == 0 {
			js.looping = false
			js.mu.Unlock()
			return
		}
		now := time.Now()
		var run []*Job
		for len(js.due) > 0 && !js.due[0].at.After(now) {
			j := heap.Pop(&js.due).(*Job)
			j.running, j.again, j.done = true, false, make(chan struct{})
			run = append(run, j)
		}
		var wait time.Duration
		if len(run) == 0 {
			wait = js.due[0].at.Sub(now)
		}
		js.mu.Unlock()
		if len(run) == 0 {
			t.Reset(wait)
			select {
			case <-t.C:
			case <-js.kick:
			case <-ctx.Done():
			}
			continue
		}
		for _, j := range run {
			select {
			case js.workers <- struct{}{}:
			case <-ctx.Done():
				js.finish(j, 0, false)
				continue
			}
			if !js.h.group.Go(func(ctx context.Context) {
				defer func() { <-js.workers }()
				ctx, cancel := context.WithCancel(ctx)
				js.mu.Lock()
				j.cancel = cancel
				stopped := j.stopped
				js.mu.Unlock()
				if stopped {
					cancel()
				}
				next, more := j.run(ctx)
				cancel()
				js.finish(j, next, more)
			}) {
				<-js.workers
				js.finish(j, 0, false)
			}
		}
	}
}

// finish ends a run: j goes back in the heap when it asked to run again or
// was scheduled meanwhile.
func (js *jobs) finish(j *Job, next time.Duration, more bool) {
	js.mu.Lock()
	defer js.mu.Unlock()
	j.running = false
	j.cancel = nil
	close(j.done)
	if j.stopped {
		return
	}
	var at time.Time
	switch {
	case more && j.again:
		at = time.Now().Add(next)
		if j.againAt.Before(at) {
			at = j.againAt
		}
	case more:
		at = time.Now().Add(next)
	case j.again:
		at = j.againAt
	default:
		return
	}
	j.again = false
	j.at = at
	heap.Push(&js.due, j)
	js.wake()
}

func (j *Job) deadline() time.Time { return j.at }
func (j *Job) setIndex(i int)      { j.index = i }

// Active reports whether j is due or running.
func (j *Job) Active() bool {
	j.js.mu.Lock()
	defer j.js.mu.Unlock()
	return j.running || j.index >= 0
}
