package semaphore

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"time"

	"github.com/sluicehq/sluice/internal/hub"
	"github.com/sluicehq/sluice/internal/rediscall"
)

// Config.Fallback: while Redis cannot be reached, a process admits from a
// share of the capacity of its own, and reconciles with Redis when it
// answers again.
//
// The dispatcher follows the Hub's reachability while it runs (it runs
// while callers wait or permits are held, so an idle Semaphore watches
// nothing), and an exchange that fails because Redis is away switches at
// once. The life of a switch:
//
//	onRedis ──away──▶ onLocal ──answers──▶ registering ──registered──▶ settling ──settleTime──▶ onRedis
//	                     ▲                      │                          │
//	                     └────────away──────────┴──────────away────────────┘
//
// onLocal: no exchange is made; waiters wait in localQ, first come first
// served, and are granted while the weight held stays within the share.
// Every held permit is unregistered: Redis may have lost it, and it has no
// lease to renew. registering: the next exchange writes every held permit
// into Redis (sync.lua's registrations) together with the releases and
// leaves kept while away; arrivals still wait here. settling: Redis has
// our permits; the waiters stay back for settleTime, while the other
// processes notice Redis is back and register theirs, so that Redis never
// hands out a place a slower process's local holder still has.

type fallbackMode int

const (
	onRedis fallbackMode = iota
	onLocal
	registering
	settling
)

// settleTime is how long a process that registered its permits at
// Redis's return keeps its waiters back: every other process notices the
// return within one probe period (hub.ProbeEvery) of it, and registers in
// its next exchange; eight periods leave room for a loaded machine.
const settleTime = 8 * hub.ProbeEvery

// localState is this process's switch for Inspect: whether it admits
// from its local share (from the switch until its waiters go back to
// Redis), since when, and the processes the capacity was divided by.
func (s *Semaphore) localState() (local bool, since time.Time, procs int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.mode != onRedis, s.since, s.procs
}

// sendTrace leaves this process's trace in Redis, in the background, when
// one is due (internal/presence): the count it reads back divides the
// capacity at the next switch.
func (s *Semaphore) sendTrace() {
	if s.trace == nil || !s.trace.Due(time.Now()) {
		return
	}
	s.bg.Go(func(ctx context.Context) {
		tctx, cancel := context.WithTimeout(ctx, s.callTimeout)
		defer cancel()
		_ = s.trace.Send(tctx) // a failed trace is sent again at the next call
	})
}

// awayCause reports whether a failed exchange found Redis away, and the
// error callers should read then: runErr is the script call's error,
// byAway that the call was abandoned because the Hub marked Redis away,
// timedOut that it ran out of its own limit, sent when it left. An error
// reply (READONLY, OOM) is Redis answering: it is a failure to report,
// never a switch.
func (s *Semaphore) awayCause(runErr error, byAway, timedOut bool, sent time.Time) (*rediscall.CallError, bool) {
	switch {
	case byAway:
		return s.noAnswer(), true
	case timedOut:
		if s.answers(sent) {
			return nil, false // slow, not away: it fails as without a fallback
		}
		return s.cause(runErr, true), true
	case hub.Unreachable(runErr):
		s.hub.MarkAwayBecause(runErr) // every handle on this client switches now
		return s.callError(runErr), true
	}
	return nil, false
}

// answers waits for the probe's verdict on a call made at since that ran
// out of its own limit (which may be shorter than the probe's bound):
// true once the probe had an answer after since (Redis is slow, not
// away), false once Redis is marked away, or when the probe gives no
// verdict within its own bound (it is not running: Close).
func (s *Semaphore) answers(since time.Time) bool {
	return s.hub.AwaitVerdict(context.Background(), since, time.Now().Add(hub.AwayAfter+2*hub.ProbeEvery))
}

// say logs msg at level through the Logger: for the first handle on the
// client to say this switch; the others on the same Logger say it at
// Debug (a process with thousands of semaphores would otherwise log
// thousands of lines per outage).
func (s *Semaphore) say(level slog.Level, msg string, args ...any) {
	s.hub.Say(s.cfg.Logger, level, msg, append([]any{"semaphore", s.cfg.Name}, args...)...)
}

// noAnswer is the cause of a switch the probe decided: Redis left a PING
// unanswered (hub.AwayAfter), or a dial to it shows why.
func (s *Semaphore) noAnswer() *rediscall.CallError {
	c := s.callError(rediscall.ErrNoAnswer)
	c.Within = hub.AwayAfter
	if perr := rediscall.Probe(context.Background(), s.rdb); perr != nil {
		c.Err = perr
	}
	return c
}

// goLocal handles a batch whose exchange found Redis away: its releases
// and leaves wait for Redis's return, its waiters and everyone else's are
// served locally. Without a share (this process never read a count) it
// fails as without a fallback, saying so.
func (s *Semaphore) goLocal(b batch, cause *rediscall.CallError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.toLocalLocked(cause) {
		s.failedLocked(b, s.noShare(cause), false)
		return
	}
	for _, p := range b.registers {
		s.registeredLocked(p) // Redis may have it
	}
	if b.set != nil {
		b.set.done <- cause
	}
	now := time.Now()
	for _, r := range b.releases {
		// The first try may have freed it: not asked any more.
		if now.Before(r.until) {
			s.retryRelease = append(s.retryRelease, releaseOp{id: r.id, until: r.until})
		}
	}
	for _, l := range b.leaves {
		if now.Before(l.until) {
			s.retryLeave = append(s.retryLeave, l)
		}
	}
}

// registeredLocked notes that Redis may hold a lease for p now: its
// registration was sent. A local permit released meanwhile had no release
// sent (Redis had not heard of it): it is released there now.
func (s *Semaphore) registeredLocked(p *Permit) {
	if p.inRedis() {
		return
	}
	p.registered = true
	if p.state != held {
		s.pendRelease = append(s.pendRelease, releaseOp{id: p.id, until: time.Now().Add(s.cfg.LeaseTTL)})
	}
}

// noShare is the failure of a process that cannot fall back.
func (s *Semaphore) noShare(cause error) error {
	return &noShareError{s.callError(cause)}
}

// noShareError is a call's failure, unreachable, in a process that knows
// no share: it matches what the call's error matches.
type noShareError struct{ call *rediscall.CallError }

func (e *noShareError) Error() string {
	return e.call.Error() + "; no local share to fall back on (Config.Fallback): this process has not reached Redis since it started, so it does not know how many processes share the capacity"
}

func (e *noShareError) Unwrap() error { return e.call }

// aboveShare is the failure of a waiter heavier than the local share: it
// could not be granted before Redis answers again.
func (s *Semaphore) aboveShare(n int) error {
	return fmt.Errorf("%w; weight %d above this process's local share %d (capacity %d over %d processes) while Redis is away, so it cannot be granted before Redis answers again",
		s.callError(s.lastErr), n, s.share, s.capacity, s.procs)
}

// toLocalLocked makes this process admit from its local share, because of
// cause; it reports false, changing nothing, when it knows no share. It is
// called again by every exchange that fails while away: then it only
// moves the waiters that exchange carried.
func (s *Semaphore) toLocalLocked(cause *rediscall.CallError) bool {
	if s.closed {
		return true // Close has failed every waiter; nothing to serve
	}
	if s.mode != onLocal && !s.switchLocalLocked(cause) {
		return false
	}
	s.moveLocalLocked()
	return true
}

// switchLocalLocked switches this process from Redis (or from
// registering its permits there) to its local share, because of cause:
// the share divides the capacity by the processes traced, and every
// permit held stays held, unregistered. It reports false, changing
// nothing, when it knows no share.
func (s *Semaphore) switchLocalLocked(cause *rediscall.CallError) bool {
	n := s.trace.Count()
	if n == 0 {
		return false
	}
	from := s.mode
	s.mode = onLocal
	s.procs, s.share, s.since = n, max(1, s.capacity/n), time.Now()
	s.lastErr = cause
	for _, p := range s.holders {
		// Its lease cannot be renewed, nor known lost: it stays held,
		// and is written into Redis at the return.
		p.unregistered = true
		if p.timer != nil {
			p.timer.Stop()
		}
	}
	// Once per switch: a registration that failed was no return.
	if from != registering {
		s.say(slog.LevelWarn, "sluice: Redis unreachable: semaphore admits from this process's local share until Redis answers again",
			"share", s.share, "capacity", s.capacity, "processes", n, "held", s.held.Load(), "err", cause)
	}
	return true
}

// moveLocalLocked moves every waiter not yet local into the local queue,
// and serves the queue's head. They join after those already there, in
// their order in Redis (tickets), then in arrival order.
func (s *Semaphore) moveLocalLocked() {
	var moved []*waiter
	for _, w := range s.waiters {
		if !w.done && !w.local {
			moved = append(moved, w)
		}
	}
	sort.Slice(moved, func(i, j int) bool {
		a, b := moved[i], moved[j]
		if (a.ticket > 0) != (b.ticket > 0) {
			return a.ticket > 0
		}
		if a.ticket != b.ticket {
			return a.ticket < b.ticket
		}
		return a.seq < b.seq
	})
	for _, w := range moved {
		if w.sent {
			// Its place in Redis, or a grant there this process never
			// heard of, is left at the return; from now on it has a new
			// id, so a late notification or that leave cannot touch it.
			s.retryLeave = append(s.retryLeave, leaveOp{id: w.id, until: w.deadline})
			delete(s.waiters, w.id)
			w.id = s.newID(w.weight, w.lane)
			s.waiters[w.id] = w
			w.sent = false
		}
		w.local = true
	}
	s.pendAcquire = nil
	s.localQ = append(s.localQ, moved...)
	s.serveLocalLocked()
}

// serveLocalLocked grants the local queue's head while its weight fits in
// the share beside what this process holds, first come first served.
func (s *Semaphore) serveLocalLocked() {
	if s.mode != onLocal {
		return
	}
	for len(s.localQ) > 0 {
		w := s.localQ[0]
		switch {
		case w.done:
		case w.weight > s.share:
			w.err = s.aboveShare(w.weight)
			s.finishLocked(w)
		case int(s.held.Load())+w.weight > s.share:
			return
		default:
			p := &Permit{s: s, id: s.newID(w.weight, w.lane), weight: w.weight, lost: make(chan struct{}), local: true, unregistered: true}
			s.holders[p.id] = p
			s.held.Add(int64(p.weight))
			w.permit = p
			s.finishLocked(w)
		}
		s.localQ[0] = nil
		s.localQ = s.localQ[1:]
	}
}

// dropLocalLocked takes w, which gave up, out of the local queue.
func (s *Semaphore) dropLocalLocked(w *waiter) {
	for i, x := range s.localQ {
		if x == w {
			s.localQ = append(s.localQ[:i], s.localQ[i+1:]...)
			break
		}
	}
	s.serveLocalLocked() // a heavy head gone may let those behind in
}

// followReach brings the switch up to date with the Hub's reachability,
// for the dispatcher: it returns the channel closed at the next change,
// and one that fires when the settling ends.
func (s *Semaphore) followReach() (changed <-chan struct{}, settled <-chan time.Time) {
	away, changed := s.hub.Away()
	s.mu.Lock()
	mode, last := s.mode, s.lastErr
	s.mu.Unlock()
	var cause *rediscall.CallError
	if away && mode != onLocal {
		// Found by the probe or another handle: the calls in flight are
		// cancelled (AwayCtx) and switch as they return; the waiters
		// queued in Redis switch now.
		var c *rediscall.CallError
		if errors.As(last, &c) {
			cause = c
		} else {
			cause = s.noAnswer()
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
	case away && s.mode != onLocal:
		if cause == nil {
			cause = s.callError(rediscall.ErrNoAnswer) // no dial under s.mu
			cause.Within = hub.AwayAfter
		}
		s.toLocalLocked(cause) // without a share, exchanges fail as they come
	case !away && s.mode == onLocal:
		s.mode = registering
		s.beatDue = true // the next exchange registers what is held
	case s.mode == settling:
		if d := time.Until(s.settleAt); d > 0 {
			settled = time.After(d)
		} else {
			s.backLocked()
		}
	}
	return changed, settled
}

// settleLocked follows the registration of this process's permits in
// Redis: the waiters stay back for settleTime.
func (s *Semaphore) settleLocked(registered int) {
	s.mode = settling
	s.settleAt = time.Now().Add(settleTime)
	s.lastErr = nil
	s.say(slog.LevelInfo, "sluice: Redis answers again: semaphore's permits held are registered there, and its waiters go back to Redis shortly",
		"registered", registered, "waiters", len(s.localQ), "after", settleTime)
}

// backLocked ends the settling: the local queue goes to Redis, in order.
func (s *Semaphore) backLocked() {
	s.mode = onRedis
	for _, w := range s.localQ {
		if !w.done {
			w.local = false
			s.pendAcquire = append(s.pendAcquire, w)
		}
	}
	s.localQ = nil
}

// pruneLocked drops, while Redis is away, the releases and leaves that no
// longer matter (their lease would have ended anyway), so an idle
// Semaphore stops watching.
func (s *Semaphore) pruneLocked() {
	now := time.Now()
	keepR := func(ops []releaseOp) []releaseOp {
		out := ops[:0]
		for _, r := range ops {
			if now.Before(r.until) {
				out = append(out, r)
			}
		}
		return out
	}
	keepL := func(ops []leaveOp) []leaveOp {
		out := ops[:0]
		for _, l := range ops {
			if now.Before(l.until) {
				out = append(out, l)
			}
		}
		return out
	}
	s.pendRelease, s.retryRelease = keepR(s.pendRelease), keepR(s.retryRelease)
	s.pendLeave, s.retryLeave = keepL(s.pendLeave), keepL(s.retryLeave)
}

// sendTraceIfOnRedis sends a trace due at a beat: a process whose
// callers hold long permits still counts.
func (s *Semaphore) sendTraceIfOnRedis() {
	if s.trace == nil {
		return
	}
	s.mu.Lock()
	on := s.mode == onRedis
	s.mu.Unlock()
	if on {
		s.sendTrace()
	}
}
