package semaphore

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/internal/scriptreply"
)

// One exchange with Redis: sending a batch, and applying its reply.

// exchange sends b to Redis and applies the reply, within s.callTimeout
// and ctx. The dispatcher's and a direct arrival's never run at once
// (s.sending); SetCapacity's may run beside either. Each is one script
// call, and the reply is applied under s.mu.
func (s *Semaphore) exchange(ctx context.Context, b batch) {
	args := s.syncArgs(b)
	tctx, cancel := context.WithTimeout(ctx, s.callTimeout)
	defer cancel()
	sent := time.Now()
	v, runErr := s.runSync(tctx, args)
	var r reply
	err := runErr
	if err == nil {
		r, err = parseReply(v, &b)
	}
	if err != nil {
		s.exchangeFailed(ctx, tctx, b, err, runErr, sent)
		return
	}
	if s.applyRefusal(b, r) {
		return
	}
	if d, ok := s.apply(b, r, sent); ok {
		// When the first lease ends while this process waits, so a dead
		// holder's place is handed on at once rather than at the next beat.
		s.poke.Reset(d)
	}
}

// runSync runs sync.lua with args: through runAway while a switch to the
// local share is possible (this process knows a share), else directly.
func (s *Semaphore) runSync(ctx context.Context, args []interface{}) (interface{}, error) {
	if s.trace != nil && s.trace.Count() > 0 {
		return s.runAway(ctx, args)
	}
	return syncScript.Run(ctx, s.scripts, s.syncKeys, args...).Result()
}

// applyRefusal handles r when it is a refusal rather than a reply (Redis
// wrote nothing): state in a format this code does not know, or a
// capacity other than the one in force. It reports whether r was one.
func (s *Semaphore) applyRefusal(b batch, r reply) bool {
	switch r.refusal {
	case "format":
		s.failed(b, s.unknownFormat(r.refused), false)
	case "mismatch":
		stored, _ := strconv.ParseInt(r.refused, 10, 64)
		s.logMismatch(stored)
		s.refuse(b, s.mismatch(stored))
	default:
		return false
	}
	return true
}

// errAway is runAway's error when Redis was marked away during the call.
var errAway = errors.New("semaphore: Redis marked away")

// runAway runs sync.lua with args, returning early, with errAway, when
// the Hub marks Redis away: a call to a frozen Redis switches to local at
// the probe's bound (hub.AwayAfter), not at its own. go-redis honours a
// ctx's deadline but not its cancellation once the call is on the wire,
// so the call runs in a goroutine of the Semaphore, which ends at ctx's
// deadline at the latest; its reply, if one comes, is dropped, and what
// Redis may have done with it is undone at the return (the leaves and
// releases kept while away; registrations are idempotent). A process that
// knows no share has nothing to switch to: its calls run as without a
// fallback.
func (s *Semaphore) runAway(ctx context.Context, args []interface{}) (interface{}, error) {
	away, changed := s.hub.Away()
	if away {
		return nil, errAway
	}
	type result struct {
		v   interface{}
		err error
	}
	done := make(chan result, 1)
	run := func(context.Context) {
		v, err := syncScript.Run(ctx, s.scripts, s.syncKeys, args...).Result()
		done <- result{v, err}
	}
	if !s.bg.Go(run) {
		run(ctx) // Close has begun: its last exchanges run inline
	}
	for {
		select {
		case r := <-done:
			return r.v, r.err
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-changed:
			if away, changed = s.hub.Away(); away {
				return nil, errAway
			}
		}
	}
}

// refuse fails b's arrivals with err: Redis refused this process's
// capacity before writing anything. Only a process never accepted is
// refused so, and it has nothing else to send (no holders, no queued
// waiters); anything else is retried as after a failure.
func (s *Semaphore) refuse(b batch, err error) {
	s.mu.Lock()
	for _, w := range b.acquires {
		if !w.done {
			w.err = err
			s.finishLocked(w)
		}
	}
	s.mu.Unlock()
	b.acquires = nil
	if !b.empty() {
		s.failed(b, err, false)
	}
}

// apply applies a reply to the local state. sent is when the batch left:
// a lease of d reported by Redis lasts at least until sent+d. It returns
// when the first lease ends, for the poke timer, if callers wait.
func (s *Semaphore) apply(b batch, r reply, sent time.Time) (time.Duration, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if l := s.cfg.Logger; l != nil {
		s.logChanges(l, b, r)
	}
	if s.mode != onLocal {
		s.lastErr = nil // else a reply from before the switch: Redis is away
	}
	s.capacity, s.accepted = int(r.capacity), true
	if b.set != nil {
		b.set.done <- nil
	}
	s.applyPermitsLocked(b, r, sent)
	s.applyWaitersLocked(b, r, sent)
	if s.beatDue || len(s.pendRelease) > 0 {
		s.kick()
	}
	if r.wait >= 0 && len(s.waiters) > 0 {
		return time.Duration(r.wait)*time.Microsecond + time.Millisecond, true
	}
	return 0, false
}

// applyPermitsLocked takes in what r says of this process's permits: the
// releases Redis no longer had, the leases renewed or gone, and the
// permits held while Redis was away, registered now.
func (s *Semaphore) applyPermitsLocked(b batch, r reply, sent time.Time) {
	for i, op := range b.releases {
		if op.asked && r.released[i] != 1 {
			// Its holder released it in good faith: the lease had ended
			// in Redis unnoticed (a restart without persistence).
			s.leasesLost.Add(1)
			if l := s.cfg.Logger; l != nil {
				l.Warn("sluice: semaphore permit released was no longer held in Redis: another caller may have held its place",
					"semaphore", s.cfg.Name, "permit", op.id)
			}
		}
	}
	for i, p := range b.renews {
		if p.state != held || p.unregistered {
			continue // released or lost meanwhile (a release follows), or Redis went away
		}
		if us := r.renewed[i]; us > 0 {
			p.deadline = sent.Add(time.Duration(us) * time.Microsecond)
			p.timer.Reset(time.Until(p.deadline))
		} else {
			s.loseLocked(p, "gone from Redis (expired there, or Redis lost it)")
		}
	}
	s.applyRegistersLocked(b, sent)
}

// applyRegistersLocked gives the permits b registered (held while Redis
// was away) the lease Redis gave them, and starts the settling when b
// was the first exchange since Redis answered again.
func (s *Semaphore) applyRegistersLocked(b batch, sent time.Time) {
	for _, p := range b.registers {
		s.registeredLocked(p)
		if p.state != held {
			continue // released meanwhile: the release follows
		}
		if s.mode == onLocal {
			continue // away again: registered again at the next return
		}
		// A lease of the LeaseTTL sent, in whole µs as sent.
		p.unregistered = false
		p.deadline = sent.Add(time.Duration(scriptreply.Micros(s.cfg.LeaseTTL)) * time.Microsecond)
		if p.timer == nil {
			p.timer = time.AfterFunc(time.Until(p.deadline), func() { s.checkLease(p) })
		} else {
			p.timer.Reset(time.Until(p.deadline))
		}
	}
	if b.returning && s.mode == registering {
		s.settleLocked(len(b.registers))
	}
}

// applyWaitersLocked takes in what r says of this process's waiters, and
// wakes those it decides: the queued ones refreshed (or granted, or too
// heavy now), the arrivals (granted, queued with a ticket, or refused),
// and the waiters granted by this call, whoever made it.
func (s *Semaphore) applyWaitersLocked(b batch, r reply, sent time.Time) {
	for i, w := range b.refresh {
		if w.done || w.local {
			continue
		}
		if us := r.refreshed[i]; us > 0 {
			s.grantLocked(w, sent.Add(time.Duration(us)*time.Microsecond))
		} else if us == -2 {
			w.err = s.tooHeavy(w.weight, s.capacity)
			s.finishLocked(w)
		} else {
			w.deadline = sent.Add(s.cfg.QueueTTL)
		}
	}
	for i, w := range b.acquires {
		status := r.acquired[i]
		if w.done || w.local {
			continue // abandoned, granted by a notification, or switched to local (its old id is left at the return)
		}
		switch {
		case status == 0:
			// A lease of the LeaseTTL sent, in whole µs as sent.
			s.grantLocked(w, sent.Add(time.Duration(scriptreply.Micros(s.cfg.LeaseTTL))*time.Microsecond))
		case status > 0:
			w.ticket = status
		case status == -2:
			w.err = s.tooHeavy(w.weight, s.capacity)
			s.finishLocked(w)
		default:
			w.err = errQueueFull
			s.finishLocked(w)
		}
	}
	for _, g := range r.granted {
		w := s.waiters[g.id]
		switch {
		case w == nil || !w.sent:
		case g.us < 0: // refused: heavier than the capacity lowered
			w.err = s.tooHeavy(w.weight, s.capacity)
			s.finishLocked(w)
		default:
			s.grantLocked(w, sent.Add(time.Duration(g.us)*time.Microsecond))
		}
	}
}

// logChanges tells l, before apply takes r in, of Redis answering again
// after failures and of a capacity in force other than the one this
// process knew. s.mu is held: these are rare.
func (s *Semaphore) logChanges(l *slog.Logger, b batch, r reply) {
	if s.lastErr != nil && s.mode == onRedis {
		// With a fallback, the return is settleLocked's to say.
		l.Info("sluice: semaphore's calls to Redis succeed again", "semaphore", s.cfg.Name)
	}
	if int(r.capacity) == s.capacity {
		return
	}
	if b.set != nil {
		l.Info("sluice: semaphore capacity set by this process (SetCapacity)", "semaphore", s.cfg.Name, "from", s.capacity, "to", r.capacity)
		return
	}
	l.Info("sluice: following the semaphore capacity in force", "semaphore", s.cfg.Name, "from", s.capacity, "to", r.capacity)
}
