package semaphore

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/rediscall"
	"github.com/sluicehq/sluice/internal/scriptreply"
)

//go:embed sync.lua
var syncSource string

var syncScript = redis.NewScript(syncSource)

// batch is everything one exchange with Redis carries.
type batch struct {
	releases  []releaseOp
	leaves    []leaveOp
	renews    []*Permit
	registers []*Permit // held while Redis was away: written into Redis (fallback.go)
	refresh   []*waiter
	acquires  []*waiter
	set       *setOp // SetCapacity, sent alone
	wantWait  bool   // ask when the first lease ends, for the poke timer
	returning bool   // the first exchange since Redis answered again (registering)
}

// setOp is a SetCapacity call.
type setOp struct {
	n    int
	done chan error
}

func (b *batch) empty() bool {
	return len(b.releases)+len(b.leaves)+len(b.renews)+len(b.registers)+len(b.refresh)+len(b.acquires) == 0 && b.set == nil
}

// dispatch runs the exchanges with Redis one at a time: whatever callers
// ask for while one is in flight goes out together in the next.
//
// It runs while there is work (kick starts it) and returns once there is
// none: an idle Semaphore runs no goroutine. With Config.Fallback it also
// follows Redis's reachability while it runs (fallback.go), and traces
// this process at its beats.
func (s *Semaphore) dispatch() {
	beat := time.NewTicker(s.cfg.beat())
	defer beat.Stop()
	if s.trace != nil {
		defer s.hub.Watch()()
	}
	for first := true; ; first = false {
		var changed <-chan struct{}
		var settled <-chan time.Time
		if s.trace != nil {
			changed, settled = s.followReach()
		}
		if !first {
			if s.idle() {
				return
			}
			select {
			case <-s.kickCh:
			case <-beat.C:
				s.requestBeat()
				s.sendTraceIfOnRedis()
			case <-changed:
			case <-settled:
			}
			if s.trace != nil {
				s.followReach()
			}
		}
		for {
			// Before each exchange: the callers the last reply woke (or a
			// burst) get to release and arrive again, and go in this one.
			s.gather()
			b, closed, busy := s.take()
			if busy {
				break // a direct arrival's exchange: it kicks when done
			}
			if b.empty() {
				if closed {
					s.dmu.Lock()
					s.dispatching = false
					s.dmu.Unlock()
					return
				}
				break
			}
			b.wantWait = true
			s.exchange(context.Background(), b)
			s.mu.Lock()
			s.doneSendingLocked()
			s.mu.Unlock()
		}
	}
}

// gather lets callers made runnable together (a burst) queue up before the
// exchange, so they share it instead of trickling into the next one: it
// yields while arrivals keep coming, a few times at most.
func (s *Semaphore) gather() {
	n := -1
	for range 8 {
		s.mu.Lock()
		m := len(s.pendAcquire) + len(s.pendRelease)
		s.mu.Unlock()
		if m == n {
			return
		}
		n = m
		runtime.Gosched()
	}
}

// take collects the next batch and marks it in flight; busy reports an
// exchange already in flight (nothing taken).
func (s *Semaphore) take() (b batch, closed, busy bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.sending {
		return b, s.closed, true
	}
	if s.mode == onLocal {
		// Redis is away: releases and leaves wait for its return.
		s.beatDue = false
		return b, s.closed, false
	}
	b.returning = s.mode == registering
	now := time.Now()
	b.releases, s.pendRelease = s.pendRelease, nil
	b.leaves, s.pendLeave = s.pendLeave, nil
	if s.beatDue && !s.closed {
		s.beatDue = false
		b.releases = append(b.releases, s.retryRelease...)
		b.leaves = append(b.leaves, s.retryLeave...)
		s.retryRelease, s.retryLeave = nil, nil
		for _, p := range s.holders {
			switch {
			case p.unregistered:
				b.registers = append(b.registers, p)
			case !now.Before(p.deadline):
				s.loseLocked(p, "not renewed in time")
			default:
				b.renews = append(b.renews, p)
			}
		}
		// loseLocked queued releases.
		b.releases = append(b.releases, s.pendRelease...)
		s.pendRelease = nil
		for _, w := range s.waiters {
			// Queued, as a reply said (tickets start at 1): an arrival
			// still in flight is not refreshed.
			if w.sent && w.ticket > 0 {
				b.refresh = append(b.refresh, w)
			}
		}
	}
	b.acquires, s.pendAcquire = s.pendAcquire, nil
	for _, w := range b.acquires {
		w.sent = true
		w.deadline = now.Add(s.cfg.QueueTTL)
	}
	s.sending = !b.empty()
	if b.returning && !s.sending {
		s.settleLocked(0) // nothing to register or send
	}
	return b, s.closed, false
}

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

// syncArgs is sync.lua's ARGV for b (see its header): the counts and
// modes first, then the ids of each list in the order of the counts.
func (s *Semaphore) syncArgs(b batch) []interface{} {
	s.mu.Lock()
	wantWait := 0
	if b.wantWait && len(s.waiters) > 0 {
		wantWait = 1
	}
	capacity, mode := s.capacity, "follow"
	switch {
	case b.set != nil:
		capacity, mode = b.set.n, "set"
	case !s.accepted:
		mode = "claim"
	}
	s.mu.Unlock()
	args := make([]interface{}, 0, 16+len(b.releases)+len(b.leaves)+len(b.renews)+len(b.registers)+2*len(b.refresh)+len(b.acquires))
	args = append(args, capacity)
	args = append(args, s.fixedArgs[:5]...)
	args = append(args, wantWait,
		len(b.releases), len(b.leaves), len(b.renews), len(b.refresh), len(b.acquires), mode)
	args = append(args, s.fixedArgs[5:]...)
	args = append(args, len(b.registers))
	for _, r := range b.releases {
		args = append(args, r.id)
	}
	for _, l := range b.leaves {
		args = append(args, l.id)
	}
	for _, p := range b.renews {
		args = append(args, p.id)
	}
	for _, p := range b.registers {
		args = append(args, p.id)
	}
	s.mu.Lock()
	for _, w := range b.refresh {
		args = append(args, w.id, strconv.FormatInt(w.ticket, 10))
	}
	s.mu.Unlock()
	for _, w := range b.acquires {
		args = append(args, w.id)
	}
	return args
}

// runSync runs sync.lua with args: through runAway while a switch to the
// local share is possible (this process knows a share), else directly.
func (s *Semaphore) runSync(ctx context.Context, args []interface{}) (interface{}, error) {
	if s.trace != nil && s.trace.Count() > 0 {
		return s.runAway(ctx, args)
	}
	return syncScript.Run(ctx, s.scripts, s.keys, args...).Result()
}

// exchangeFailed handles an exchange of b that got no usable reply: err
// is the call's error (runErr) or, when the call succeeded, the reply's.
// ctx is the exchange's caller's, tctx the exchange's own, with its time
// limit; sent is when the call left.
func (s *Semaphore) exchangeFailed(ctx, tctx context.Context, b batch, err, runErr error, sent time.Time) {
	// A direct arrival's caller's ctx ended (go-redis may report its
	// deadline as a socket timeout a moment early): Acquire gives
	// the place up and returns ctx's error, as when it ends in the
	// queue. Otherwise only this exchange's own time limit makes it
	// "no answer".
	if dl, ok := ctx.Deadline(); ctx.Err() != nil || (ok && time.Until(dl) < time.Millisecond) {
		s.failed(b, err, true)
		return
	}
	byAway := errors.Is(runErr, errAway)
	timedOut := !byAway && tctx.Err() != nil && ctx.Err() == nil
	if s.trace != nil && runErr != nil {
		if cause, away := s.awayCause(runErr, byAway, timedOut, sent); away {
			s.goLocal(b, cause)
			return
		}
	}
	s.failed(b, s.cause(err, timedOut), false)
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
		v, err := syncScript.Run(ctx, s.scripts, s.keys, args...).Result()
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

// logMismatch tells the Logger that Redis refused this process's
// capacity, once for each capacity in force it meets rather than once per
// call.
func (s *Semaphore) logMismatch(stored int64) {
	l := s.cfg.Logger
	if l == nil {
		return
	}
	s.mu.Lock()
	said := s.mismatchSaid == stored
	s.mismatchSaid = stored
	s.mu.Unlock()
	if !said {
		l.Warn("sluice: this process's semaphore Capacity differs from the one in force; refusing it (deploy one Capacity, call SetCapacity, or set Config.Adopt to follow)",
			"semaphore", s.cfg.Name, "mine", s.cfg.Capacity, "in_force", stored)
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

// cause is what made an exchange fail, as callers should read it: a
// *rediscall.CallError naming Redis's or the network's error ("connection
// refused"). When the exchange ran out of its own time limit, go-redis
// reports only that limit's context.DeadlineExceeded, which is not the
// caller's deadline and must not match it: the cause then says no answer
// came within the limit, and names why if a dial to the server shows it
// (connection refused), or else the last error Redis gave before, if any
// was a reason.
func (s *Semaphore) cause(err error, timedOut bool) *rediscall.CallError {
	if !timedOut {
		return s.callError(err)
	}
	s.mu.Lock()
	last := s.lastErr
	s.mu.Unlock()
	c := s.callError(rediscall.ErrNoAnswer)
	c.Within = s.callTimeout
	var lastCall *rediscall.CallError
	if perr := rediscall.Probe(context.Background(), s.rdb); perr != nil {
		c.Err = perr
	} else if errors.As(last, &lastCall) && !errors.Is(lastCall.Err, rediscall.ErrNoAnswer) {
		c.Err = lastCall.Err
	}
	return c
}

// callError is err, the failure of a call to Redis, as this semaphore's
// CallError; one already is returned as it is.
func (s *Semaphore) callError(err error) *rediscall.CallError {
	var c *rediscall.CallError
	if errors.As(err, &c) {
		return c
	}
	return &rediscall.CallError{Prefix: "semaphore", Name: s.cfg.Name, Addr: rediscall.Addr(s.rdb), Err: err}
}

// failed handles a batch Redis did not answer, because of cause. Its
// effects are unknown, so releases and leaves are retried while they can
// still matter, and arrivals fail (and leave, in case they were
// recorded) with an error naming cause; so do the waiters already queued,
// whose places this process cannot keep while Redis does not answer:
// that bounds how long Acquire blocks while Redis is away (see Acquire).
// cause is kept for the waiters whose ctx ends meanwhile. callerEnded
// means the exchange failed because its caller's ctx ended: the arrivals
// are left to their Acquire, which gives them up.
func (s *Semaphore) failed(b batch, cause error, callerEnded bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.failedLocked(b, cause, callerEnded)
}

// failedLocked is failed with s.mu held.
func (s *Semaphore) failedLocked(b batch, cause error, callerEnded bool) {
	if !callerEnded {
		if l := s.cfg.Logger; l != nil && s.lastErr == nil {
			l.Warn("sluice: semaphore's calls to Redis fail: arrivals fail, waiters and holders keep trying until their ctx or lease ends",
				"semaphore", s.cfg.Name, "err", cause)
		}
		s.lastErr = cause
	}
	var err error = s.callError(cause)
	if errors.As(cause, new(*noShareError)) {
		err = cause // it says more than the call's error
	}
	now := time.Now()
	if b.set != nil {
		b.set.done <- err
	}
	for _, r := range b.releases {
		if !now.Before(r.until) {
			continue
		}
		if callerEnded {
			// Only an arrival's caller gave up: send them again now (the
			// direct lane kicks the dispatcher when its exchange ends).
			s.pendRelease = append(s.pendRelease, releaseOp{id: r.id, until: r.until})
		} else {
			s.retryRelease = append(s.retryRelease, releaseOp{id: r.id, until: r.until})
		}
	}
	for _, l := range b.leaves {
		if now.Before(l.until) {
			s.retryLeave = append(s.retryLeave, l)
		}
	}
	for _, w := range b.acquires {
		s.retryLeave = append(s.retryLeave, leaveOp{id: w.id, until: w.deadline})
		if !w.done && !callerEnded {
			w.err = err
			s.finishLocked(w)
		}
	}
	if callerEnded {
		return
	}
	for _, w := range s.waiters {
		if w.done || !w.sent || w.ticket <= 0 {
			continue // not queued in Redis: its own exchange decides it
		}
		s.retryLeave = append(s.retryLeave, leaveOp{id: w.id, until: w.deadline})
		w.err = err
		s.finishLocked(w)
	}
	if b.returning {
		// Redis answers but refused the registration (READONLY, OOM):
		// the waiters kept back fail as queued ones do; the permits held
		// stay held and their registration is tried again at each beat.
		for _, w := range s.localQ {
			if !w.done {
				w.err = err
				s.finishLocked(w)
			}
		}
		s.localQ = nil
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

// reply is sync.lua's answer; see its header.
type reply struct {
	released, left, renewed, refreshed []int64
	acquired                           []int64
	granted                            []grant
	wait                               int64
	capacity                           int64 // in force

	// A refusal instead: "format" with the stored format, or "mismatch"
	// with the stored capacity.
	refusal, refused string
}

type grant struct {
	id string
	us int64
}

var errReply = errors.New("unexpected reply from sync.lua")

func parseReply(v interface{}, b *batch) (reply, error) {
	var r reply
	top, ok := v.([]interface{})
	if !ok || len(top) < 2 {
		return r, fmt.Errorf("%w: %T %v", errReply, v, v)
	}
	if kind, ok := top[0].(string); ok {
		var ok2 bool
		switch x := top[1].(type) {
		case string:
			r.refused, ok2 = x, true
		case int64:
			r.refused, ok2 = strconv.FormatInt(x, 10), true
		}
		if len(top) != 2 || !ok2 || (kind != "format" && kind != "mismatch") {
			return r, fmt.Errorf("%w: refusal %v", errReply, top)
		}
		r.refusal = kind
		return r, nil
	}
	// {capacity, wait, released..., left..., renewed..., refreshed...,
	// acquired..., granted...}: every list but granted has the length the
	// batch asked for.
	fixed := 2 + len(b.releases) + len(b.leaves) + len(b.renews) + len(b.refresh) + len(b.acquires)
	if len(top) < fixed || (len(top)-fixed)%2 != 0 {
		return r, fmt.Errorf("%w: %d values for a batch that wants %d and grant pairs", errReply, len(top), fixed)
	}
	ints := make([]int64, fixed)
	for i := range ints {
		if ints[i], ok = top[i].(int64); !ok {
			return r, fmt.Errorf("%w: %T where an integer belongs", errReply, top[i])
		}
	}
	r.capacity, r.wait = ints[0], ints[1]
	if r.capacity < 1 {
		return r, fmt.Errorf("%w: capacity %d", errReply, r.capacity)
	}
	rest := ints[2:]
	next := func(n int) []int64 {
		out := rest[:n:n]
		rest = rest[n:]
		return out
	}
	r.released = next(len(b.releases))
	r.left = next(len(b.leaves))
	r.renewed = next(len(b.renews))
	r.refreshed = next(len(b.refresh))
	r.acquired = next(len(b.acquires))
	for i := fixed; i < len(top); i += 2 {
		id, ok1 := top[i].(string)
		us, ok2 := top[i+1].(int64)
		if !ok1 || !ok2 {
			return r, fmt.Errorf("%w: grant %v %v", errReply, top[i], top[i+1])
		}
		r.granted = append(r.granted, grant{id: id, us: us})
	}
	return r, nil
}
