package queue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// The push lane: callers who arrive while others wait need none of
// enqueue.lua's decisions (no token can be theirs at once, no refusal is
// configured), only a place in the queue, so they are pushed with plain
// commands in one transaction: MULTI, TIME, GET state, RPUSH, PEXPIRE NX,
// EXEC. Redis executes that for about a fifth of the instructions of the
// script (26.5k against 131k per arrival, docs/benchmarks.md), and the
// caller computes its estimate from the state it read, exactly as the
// script would have.
//
// A pushed entry is "<id>|0": its estimate is not known when it is pushed,
// so the scheduler publishes it with its slot on the wake channel as soon
// as it assigns it (step.lua: an estimate of 0 is always early), and the
// caller polls once, a lead before that slot. The estimate it sleeps on is
// only the fallback for a lost message.

// ErrNoPush reports that the push lane is not available and nothing was
// pushed: another client than *redis.Client, more than one policy,
// MaxQueue or MaxWait set, or a server that refused the transaction
// (Redis < 7.0 has no PEXPIRE NX). Use EnqueueBatch.
var ErrNoPush = errors.New("queue: push lane not available")

// CanPush reports whether PushBatch may be used.
func (q *Queue) CanPush() bool {
	return q.direct != nil && len(q.policies) == 1 && q.opt.MaxQueue == 0 && q.opt.MaxWait == 0 && !q.noPush.Load()
}

// PushBatch queues callers ids, in order, at the tail of the queue, as
// EnqueueBatch would if no token were theirs within the lookahead. A
// caller pushed while the queue was empty and a token free waits for the
// scheduler to hand it out (its reply says whether one runs), so it is
// for callers who arrive while others wait.
func (q *Queue) PushBatch(ctx context.Context, ids []string) ([]EnqueueReply, error) {
	if !q.CanPush() {
		return nil, ErrNoPush
	}
	entries := make([]any, len(ids))
	for i, id := range ids {
		entries[i] = id + "|0"
	}
	var (
		now   *redis.TimeCmd
		state *redis.StringCmd
		push  *redis.IntCmd
	)
	_, err := q.direct.TxPipelined(ctx, func(p redis.Pipeliner) error {
		now = p.Time(ctx)
		state = p.Get(ctx, q.keys.State)
		push = p.RPush(ctx, q.keys.Queue, entries...)
		// A queue this push creates gets a TTL; one that exists keeps the
		// one the scheduler's steps renew (tail + grace).
		p.Do(ctx, "PEXPIRE", q.keys.Queue, q.opt.Grace.Milliseconds(), "NX")
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		var rerr redis.Error
		if errors.As(err, &rerr) {
			// The server refused the transaction: scripts from now on.
			q.noPush.Store(true)
			if strings.HasPrefix(err.Error(), "EXECABORT") {
				// Refused as a whole (Redis < 7.0 has no PEXPIRE NX):
				// nothing ran, the callers may enqueue by script.
				return nil, fmt.Errorf("%w: %v", ErrNoPush, err)
			}
			// MULTI itself refused (an ACL without it): the commands ran
			// one by one and the callers' entries may be queued; they
			// fail once, and a token may go to an entry nobody polls.
			return nil, fmt.Errorf("queue: push lane refused, scripts from now on: %w", err)
		}
		return nil, err
	}
	raw, err := state.Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	return pushReplies(ids, now.Val().UnixMicro(), raw, push.Val(), q.policies[0])
}

// pushReplies computes, from what the transaction read, the replies
// enqueue.lua would have given: positions L−k+1 … L, tickets done +
// position, estimates from the state refilled to now (lib.lua's refill and
// slot_for), and whether a scheduler runs (the state's until).
func pushReplies(ids []string, now int64, state string, length int64, p Policy) ([]EnqueueReply, error) {
	k := int64(len(ids))
	if length < k {
		return nil, fmt.Errorf("%w: RPUSH of %d gave length %d", ErrReply, k, length)
	}
	done, until, level, anchor := int64(0), int64(0), p.Capacity, now
	if state != "" {
		f := strings.Fields(state)
		if len(f) < 4 {
			return nil, fmt.Errorf("%w: state %q", ErrReply, state)
		}
		var v [4]int64
		for i := range v {
			n, err := strconv.ParseInt(f[i], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("%w: state %q", ErrReply, state)
			}
			v[i] = n
		}
		done, until = v[0], v[1]
		level, anchor = refill(v[2], v[3], now, p)
	}
	out := make([]EnqueueReply, k)
	for i := range out {
		pos := length - k + int64(i) + 1
		est := slotFor(level, anchor, now, pos, p)
		out[i] = EnqueueReply{
			Kind:             Queued,
			Delay:            dur(est-now, time.Microsecond),
			Position:         int(pos),
			SchedulerRunning: until > now,
			Ticket:           done + pos,
			Entry:            ids[i] + "|0",
			Now:              now,
		}
	}
	return out, nil
}

// refill is lib.lua's refill for one policy, in integer µs.
func refill(level, anchor, now int64, p Policy) (int64, int64) {
	freq := p.Every.Microseconds()
	if now > anchor && freq > 0 {
		if n := (now - anchor) / freq; n > 0 {
			level = min(p.Capacity, level+n*p.Amount)
			anchor += n * freq
		}
	}
	return level, anchor
}

// slotFor is lib.lua's slot_all for one policy: when the k-th token from
// now on is due.
func slotFor(level, anchor, now, k int64, p Policy) int64 {
	if level >= k {
		return now
	}
	need := k - level
	slot := anchor + (need+p.Amount-1)/p.Amount*p.Every.Microseconds()
	return max(slot, now)
}
