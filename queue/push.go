package queue

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/internal/scriptreply"
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
// A pushed entry is "<id>|0" (protocol.MakeEntry with no estimate): its estimate is not known when it is pushed,
// so the scheduler publishes it with its slot on the wake channel as soon
// as it assigns it (step.lua: an estimate of 0 is always early), and the
// caller polls once, a lead before that slot. The estimate it sleeps on is
// only the fallback for a lost message.

// lane is the push lane's state: whether it is open, and until when the
// last caller this process queued surely still waits.
type lane struct {
	off atomic.Bool // the server refused the transaction: scripts from now on
	// busyUntil (unix ns, local clock, used only as a duration from the
	// reply): until then the last caller this Queue queued is surely
	// still in the queue, so whoever arrives finds someone waiting.
	busyUntil atomic.Int64
}

// errNoPush reports that the push lane is not available and nothing was
// pushed: use the script.
var errNoPush = errors.New("queue: push lane not available")

// open says whether arrivals take the push lane: while the last caller
// this Queue queued is surely still in the queue. Then enqueue.lua would
// only queue the caller too (nobody overtakes a waiting caller), so the
// lanes give the same outcome; a guess that is out of date (callers ahead
// cancelled and the queue emptied) costs the caller a scheduler step, not
// a token. The lane needs one server (*redis.Client), one policy that
// counts calls, callers without costs of their own, and neither MaxQueue
// nor MaxWait (their refusals are the script's).
func (l *lane) open(q *Queue) bool {
	return q.canPush() && time.Now().UnixNano() < l.busyUntil.Load()
}

// canPush says whether the push lane may be used at all.
func (q *Queue) canPush() bool {
	return q.direct != nil && q.conf.Load().pushable && q.opt.MaxQueue == 0 && q.opt.MaxWait == 0 && !q.lane.off.Load()
}

// note records what the last arrival of a batch learned of the queue: a
// caller queued with its slot estimated d from now stays in the queue until
// the scheduler takes it, a lookahead before its slot.
func (l *lane) note(q *Queue, a queueio.Arrival) {
	if a.Queued() && a.Delay > q.opt.Lookahead {
		l.busyUntil.Store(time.Now().Add(a.Delay - q.opt.Lookahead).UnixNano())
	} else {
		l.busyUntil.Store(0)
	}
}

// push queues callers ids, in order, at the tail of the queue, as
// enqueue.lua would if no token were theirs within the lookahead. A
// caller pushed while the queue was empty and a token free waits for the
// scheduler to hand it out (its reply says whether one runs), so it is
// for callers who arrive while others wait.
func (q *Queue) push(ctx context.Context, ids []string) ([]queueio.Arrival, error) {
	if !q.canPush() {
		return nil, errNoPush
	}
	entries := make([]any, len(ids))
	for i, id := range ids {
		entries[i] = protocol.MakeEntry(id, 0, "")
	}
	var (
		now   *redis.TimeCmd
		state *redis.StringCmd
		push  *redis.IntCmd
		due   *redis.ZSliceCmd
	)
	_, err := q.direct.TxPipelined(ctx, func(p redis.Pipeliner) error {
		now = p.Time(ctx)
		state = p.Get(ctx, q.keys.State)
		push = p.RPush(ctx, q.keys.Queue, entries...)
		if lo, _ := protocol.ClaimWindow(q.opt.MaxLateness); lo > 0 { // else nobody claims: no read
			due = p.ZRangeByScoreWithScores(ctx, q.keys.Due, &redis.ZRangeBy{Min: "-inf", Max: "+inf", Count: 1})
		}
		// A queue this push creates gets a TTL; one that exists keeps the
		// one the scheduler's steps renew (tail + grace).
		p.Do(ctx, "PEXPIRE", q.keys.Queue, q.opt.Grace.Milliseconds(), "NX")
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, q.pushFailed(err)
	}
	raw, err := state.Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	c := q.conf.Load()
	rs, ours, err := pushReplies(ids, now.Val().UnixMicro(), raw, push.Val(), c.policies[0], c.id)
	if err == nil && due != nil {
		q.claimable(rs, due.Val(), now.Val().UnixMicro())
	}
	if !ours {
		// The state is of another configuration (a live change this
		// process has not heard of) or format: the estimates are only
		// guesses (the scheduler tells each pushed caller its slot), and
		// the next arrival takes the script, which tells.
		q.lane.busyUntil.Store(0)
	}
	return rs, err
}

// pushFailed is the error of a push transaction that failed with err; a
// server that refused the transaction closes the lane: scripts from now
// on.
func (q *Queue) pushFailed(err error) error {
	var rerr redis.Error
	if !errors.As(err, &rerr) {
		return err
	}
	q.lane.off.Store(true)
	if q.opt.Logger != nil {
		q.opt.Logger.Warn("sluice: the push lane is off: the server refused its transaction; arrivals take the enqueue script from now on", "bucket", q.keys.State, "err", err)
	}
	if strings.HasPrefix(err.Error(), "EXECABORT") {
		// Refused as a whole (Redis < 7.0 has no PEXPIRE NX): nothing
		// ran, the callers may enqueue by script.
		return fmt.Errorf("%w: %v", errNoPush, err)
	}
	// MULTI itself refused (an ACL without it): the commands ran one by
	// one and the callers' entries may be queued; they fail once, and a
	// token may go to an entry nobody polls.
	return fmt.Errorf("queue: push lane refused, scripts from now on: %w", err)
}

// pushReplies computes, from what the transaction read, the replies
// enqueue.lua would have given: positions L−k+1 … L, tickets done +
// position, estimates from the state refilled to now (protocol.Refill and
// SlotFor, tokens.lua's twins), and whether a scheduler runs (the state's
// until). ours reports that the state was written under the configuration
// id; when it was not (or is missing), the estimates are those of a full
// bucket of policy p and the tickets count from the state's done if it
// can be read: the callers are queued all the same.
func pushReplies(ids []string, now int64, raw string, length int64, p protocol.Policy, id string) (rs []queueio.Arrival, ours bool, err error) {
	k := int64(len(ids))
	if length < k {
		return nil, false, fmt.Errorf("%w: RPUSH of %d gave length %d", scriptreply.ErrReply, k, length)
	}
	done, until, level, anchor, hold := int64(0), int64(0), p.Capacity, now, int64(0)
	if raw != "" {
		st, err := protocol.ParseState(raw, 1)
		if err == nil {
			done, until = st.Done, st.Until
			if ours = st.ID == id; ours {
				level, anchor = protocol.Refill(st.Levels[0].Level, st.Levels[0].Anchor, now, p)
				if st.Holds(0, now) { // tokens.lua's slot_all: held back to the hold
					hold = st.Hold
				}
			}
		}
	}
	out := make([]queueio.Arrival, k)
	for i := range out {
		pos := length - k + int64(i) + 1
		est := max(protocol.SlotFor(level, anchor, now, pos, p), hold)
		out[i] = queueio.Arrival{
			Delay:            dur(est-now, time.Microsecond),
			Position:         int(pos),
			SchedulerRunning: until > now,
			Ticket:           done + pos,
			Entry:            protocol.MakeEntry(ids[i], 0, ""),
			Now:              now,
		}
	}
	return out, ours, nil
}

// claimable marks the first of the arrivals rs to poll at once when the
// earliest slot of the due set (first, as read at now µs), another
// handle's, was not collected within the claim window's start: a caller
// still queued claims it (poll.lua), which its caller, not running,
// would lose.
func (q *Queue) claimable(rs []queueio.Arrival, first []redis.Z, now int64) {
	lo, hi := protocol.ClaimWindow(q.opt.MaxLateness)
	if len(first) == 0 || lo == 0 || len(rs) == 0 {
		return
	}
	m, _ := first[0].Member.(string)
	if protocol.SameHandle(m, rs[0].Entry) {
		return // its own handle's callers run when it does (claim.lua)
	}
	if at := int64(first[0].Score); at <= now-hi && at >= now-protocol.ClaimReach.Microseconds() {
		rs[0].Claim = true
	}
}
