package queue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/internal/scriptreply"
)

// Queue runs the scripts of one bucket. It is safe for concurrent use.
type Queue struct {
	rdb  queueio.Client
	keys queueio.Keys // opt.Keys
	opt  queueio.Options

	// direct is rdb when it is one server (*redis.Client, or a client
	// that wraps one and says so with a Direct method): then a poll is first TIME and GETDEL in one
	// pipeline, which costs Redis a fraction of a script, and arrivals
	// behind waiting callers may take the push lane. On Cluster or Ring,
	// TIME could reach another node than the bucket's keys, with another
	// clock, so both stay scripts.
	direct directClient

	conf atomic.Pointer[conf] // the configuration this Queue runs under (config.go)
	lane lane                 // the push lane (push.go)
	// granting: the last caller this Queue enqueued alone was granted at
	// once, so the next tries the fast lane (fast.go).
	granting atomic.Bool
}

// New returns the Queue of the bucket whose keys are opt.Keys
// (queueio.NewKeys). It does not talk to Redis: each script is sent on its
// first use (EVALSHA, with EVAL when Redis does not have it yet).
func New(rdb queueio.Client, opt queueio.Options) *Queue {
	if opt.MaxBatch <= 0 {
		opt.MaxBatch = 1000
	}
	q := &Queue{rdb: rdb, keys: opt.Keys, opt: opt}
	q.conf.Store(newConf(opt.Policies))
	switch c := rdb.(type) {
	case *redis.Client:
		if c != nil {
			q.direct = c
		}
	case interface {
		directClient
		Direct() *redis.Client
	}:
		if c.Direct() != nil {
			q.direct = c
		}
	}
	return q
}

// directClient is what a Queue needs of one server for its direct polls
// and its push lane.
type directClient interface {
	Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
	TxPipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
}

// Options returns the options q was made with (MaxBatch filled in), with
// the policies it runs under now (Follow may have changed them; their id
// is protocol.ConfigID's). The policies are the caller's to change.
func (q *Queue) Options() queueio.Options {
	o := q.opt
	o.Policies = slices.Clone(q.conf.Load().policies)
	return o
}

func us(d time.Duration) int64 { return scriptreply.Micros(d) }

func dur(n int64, unit time.Duration) time.Duration { return scriptreply.Dur(n, unit) }

// Enqueue makes callers ids (fresh, unique IDs without a '|') arrive at
// the bucket in one round trip, in the order given, each handled as if it
// had come alone: with nobody queued and its tokens due within the
// lookahead a caller gets them at once; otherwise it joins the queue,
// unless MaxQueue or MaxWait refuse it. costs, when not nil, holds each
// caller's costs, one per policy (nil for a caller taking each policy's
// Call); a caller's slot is the latest its policies allow after the
// callers ahead of it, so none overtakes another. waits, when not nil,
// holds the longest each caller may wait (0: no bound of its own, only
// MaxWait): a caller whose slot is estimated further off is refused with
// queueio.ErrWaitTooLong, taking nothing. Callers without costs of their
// own arriving while others surely wait take the push lane (push.go),
// which Redis runs for a fifth of the script's cost; the lane cannot
// refuse, so a pushed caller whose estimate (Delay) passes its wait is
// queued all the same, and its caller must Cancel it.
func (q *Queue) Enqueue(ctx context.Context, ids []string, costs [][]int64, waits []time.Duration) ([]queueio.Arrival, error) {
	var (
		rs   []queueio.Arrival
		err  error
		done bool
	)
	if costs == nil && q.lane.open(q) && !protocol.AnyLane(ids) {
		rs, err = q.push(ctx, ids)
		done = !errors.Is(err, errNoPush)
	} else {
		rs, done, err = q.tryFast(ctx, ids, costs, waits)
	}
	if !done {
		rs, err = q.enqueueScript(ctx, ids, costs, waits)
	}
	if err == nil {
		last := rs[len(rs)-1]
		q.lane.note(q, last)
		if len(ids) == 1 {
			q.granting.Store(last.Err == nil && !last.Queued())
		}
	}
	return rs, err
}

func (q *Queue) enqueueScript(ctx context.Context, ids []string, costs [][]int64, waits []time.Duration) ([]queueio.Arrival, error) {
	cs := make([]string, len(ids))
	for i := range ids {
		if costs != nil {
			cs[i] = protocol.Costs(costs[i])
		}
	}
	reply, err := q.runFor(ctx, enqueueScript, enqueueKeys(q.keys), true, func(c *conf) ([]any, error) {
		return q.enqueueArgs(c, ids, costs, cs, waits)
	})
	return parseEnqueue(ids, cs, reply, err)
}

// enqueueArgs is enqueue.lua's ARGV for callers ids of costs (cs: as
// strings) and waits under configuration c.
func (q *Queue) enqueueArgs(c *conf, ids []string, costs [][]int64, cs []string, waits []time.Duration) ([]any, error) {
	if costs != nil && len(costs[0]) != len(c.policies) {
		return nil, &queueio.ConfigError{Mine: c.id} // costs of a configuration Follow replaced
	}
	o := q.opt
	args := make([]any, 0, 7+len(c.args)+1+3*len(ids))
	args = append(args, us(o.Lookahead), o.MaxQueue, us(o.MaxWait), us(o.Grace), o.MaxBatch, us(o.Lead), q.keys.Wake)
	args = append(args, c.args...)
	args = append(args, len(ids))
	for i, id := range ids {
		var w int64
		if waits != nil && waits[i] > 0 {
			w = max(us(waits[i]), 1) // under a µs is still a bound
		}
		args = append(args, id, cs[i], w)
	}
	return args, nil
}

const (
	kindGranted     = 0 // start now
	kindAssigned    = 1 // start after the delay
	kindQueued      = 2 // wait in the queue; the delay estimates the slot
	kindQueueFull   = 3
	kindWaitTooLong = 4
)

// parseEnqueue checks an enqueue reply for callers ids.
func parseEnqueue(ids, costs []string, reply any, err error) ([]queueio.Arrival, error) {
	v, err := scriptreply.Ints(reply, err)
	if err != nil {
		return nil, err
	}
	n := len(ids)
	if len(v) != 3+3*n {
		return nil, fmt.Errorf("%w: enqueue of %d callers gave %d values", scriptreply.ErrReply, n, len(v))
	}
	now, running, lanes, ticket := v[0], v[1]&1 == 1, v[1]&2 != 0, v[2]
	out := make([]queueio.Arrival, n)
	for i := range out {
		e := v[3+3*i : 6+3*i]
		kind, delay := e[0], e[1]
		if kind < kindGranted || kind > kindWaitTooLong || e[2] < 0 {
			return nil, fmt.Errorf("%w: enqueue %v", scriptreply.ErrReply, e)
		}
		r := queueio.Arrival{Delay: dur(delay, time.Microsecond), Position: int(e[2]), Now: now, Lanes: lanes}
		switch kind {
		case kindGranted, kindAssigned:
			r.Ticket, r.Slot = ticket, now+delay
			ticket++
		case kindQueued:
			r.Ticket, r.SchedulerRunning = ticket, running
			r.Entry = protocol.MakeEntry(ids[i], now+delay, costs[i])
			ticket++
		case kindQueueFull:
			r.Err = queueio.ErrQueueFull
		case kindWaitTooLong:
			r.Err = queueio.ErrWaitTooLong
		}
		out[i] = r
	}
	return out, nil
}

// Poll asks for the slot of the caller queued as entry, consuming it if
// found. On one server it first tries TIME and GETDEL of the slot key in
// one pipeline; only when no slot is there yet (or on Cluster) does it run
// the poll script, which also tells where in the queue the caller is. A
// caller of the bucket's own costs whose poll script finds its slot ahead
// claims, in exchange, a slot whose caller did not come for it within the
// window its MaxLateness sets (protocol.ClaimWindow), if the due set
// holds one; a caller still queued takes such a slot, or tokens nobody
// came for (poll.lua), and leaves the queue (queueio.Arrival.Claim says
// when to poll for one at once). With claim the script runs at once,
// direct poll or not: a caller told that there may be something to take
// (a direct poll claims nothing).
func (q *Queue) Poll(ctx context.Context, entry string, claim bool) (queueio.PollReply, error) {
	direct := q.direct != nil && !claim
	tol := us(q.opt.MaxLateness)
	if q.opt.MaxLateness < 0 {
		tol = 1 << 52 // never stale
	}
	lo, hi := protocol.ClaimWindow(q.opt.MaxLateness)
	trips := 0
	if direct {
		trips++
		r, found, err := q.pollDirect(ctx, entry, tol)
		if err != nil || found {
			r.RoundTrips += trips
			return r, err
		}
	}
	r, err := parsePoll(q.runFor(ctx, pollScript, q.keys.All(), true, func(c *conf) ([]any, error) {
		o := q.opt
		return append([]any{entry, tol, lo, hi, us(o.Lookahead), o.MaxBatch, us(o.Grace), us(o.Lead), q.keys.Wake}, c.args...), nil
	}))
	r.RoundTrips = trips + 1
	return r, err
}

// pollDirect is the script's first branch in plain commands: a slot key,
// once written, is only ever read and deleted by its own caller's poll
// (or swapped whole by a claim, atomically), so TIME need not run
// atomically with GETDEL; the pipeline only has to reach the one server
// whose clock wrote the slot. For a caller of the bucket's own costs it
// also takes the caller out of the due set. (It claims nothing: a claim
// after a direct poll, one more round trip for every poll that saw a
// candidate, was taken out: TestThousandsOfHandlesOneClient's 6,600
// callers on one client met a Redis too busy to answer a PING within
// 1 s in 2 of 5 CI runs.)
func (q *Queue) pollDirect(ctx context.Context, entry string, tol int64) (queueio.PollReply, bool, error) {
	var now *redis.TimeCmd
	var slot *redis.StringCmd
	var acks *redis.Cmd
	bare := protocol.EntryID(entry)
	own := protocol.EntryCosts(entry) == ""
	_, err := q.direct.Pipelined(ctx, func(p redis.Pipeliner) error {
		now = p.Time(ctx)
		slot = p.GetDel(ctx, q.keys.Slot+bare)
		if own {
			p.ZRem(ctx, q.keys.Due, entry)
		}
		acks = q.wait(ctx, p)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return queueio.PollReply{}, false, err
	}
	if errors.Is(slot.Err(), redis.Nil) {
		return queueio.PollReply{}, false, nil
	}
	if err := q.acked(acks); err != nil {
		return queueio.PollReply{}, true, err // the slot was found, and is spent
	}
	r, ok := slotReply(slot.Val(), now.Val().UnixMicro(), tol)
	if !ok {
		return queueio.PollReply{}, false, fmt.Errorf("%w: slot key holds %q", scriptreply.ErrReply, slot.Val())
	}
	return r, true, nil
}

// slotReply is what a poll that read the slot key's value v at now (µs)
// replies: Found, or Stale when the slot passed more than tol ago.
func slotReply(v string, now, tol int64) (queueio.PollReply, bool) {
	s, room, ok := protocol.ParseSlotValue(v)
	if !ok {
		return queueio.PollReply{}, false
	}
	r := queueio.PollReply{Found: true, Delay: dur(s-now, time.Microsecond), Slot: s}
	r.Room, r.Swapped = protocol.Swapped(room)
	if protocol.Taken(room) {
		r.Found, r.Stale, r.Room = false, true, ""
	} else if s-now < -tol {
		r.Found, r.Stale = false, true
	}
	return r, true
}

// parsePoll checks a poll reply: {kind, delay µs, position, lock TTL ms,
// slot[, room]}, kind 1 found, 2 waiting, 3 stale, 4 lost, 5 found by a
// claim (poll.lua).
func parsePoll(reply any, err error) (queueio.PollReply, error) {
	var room string
	if a, ok := reply.([]any); ok && len(a) == 6 && err == nil {
		if room, ok = a[5].(string); !ok {
			return queueio.PollReply{}, fmt.Errorf("%w: poll %v", scriptreply.ErrReply, reply)
		}
		reply = a[:5]
	}
	v, err := scriptreply.Ints(reply, err)
	if err != nil {
		return queueio.PollReply{}, err
	}
	if len(v) != 5 || v[0] < 1 || v[0] > 5 {
		return queueio.PollReply{}, fmt.Errorf("%w: poll %v", scriptreply.ErrReply, v)
	}
	r := queueio.PollReply{
		Found:    v[0] == 1 || v[0] == 5,
		Claimed:  v[0] == 5,
		Stale:    v[0] == 3,
		Lost:     v[0] == 4,
		Delay:    dur(v[1], time.Microsecond),
		Position: int(v[2]),
		LockTTL:  dur(v[3], time.Millisecond),
		Slot:     v[4],
	}
	if v[0] == 2 {
		r.Told, r.Slot = v[4] == 1, 0
	}
	r.Room, r.Swapped = protocol.Swapped(room)
	r.Swapped = r.Swapped && !r.Claimed
	if v[3] < 0 {
		r.LockTTL = -1
	}
	return r, nil
}

// Estimate says, without changing anything, how long from now a caller of
// costs (nil: each policy's Call) would wait for its slot if it entered
// now, and how many callers would be ahead of it. The wait is exact unless
// callers ahead leave the queue.
//
// lane is the caller's lane, as protocol.LaneID names it ("" for the
// default one): the wait counts its lane's callers, and its share of its
// class's rate when named lanes have callers (an estimate: the lanes'
// callers still to come decide it); the callers ahead are its lane's.
func (q *Queue) Estimate(ctx context.Context, lane string, costs []int64) (time.Duration, int, error) {
	v, err := scriptreply.Ints(q.run(ctx, estimateScript, estimateKeys(q.keys), func(c *conf) ([]any, error) {
		if costs != nil && len(costs) != len(c.policies) {
			return nil, &queueio.ConfigError{Mine: c.id}
		}
		return append(append([]any{}, c.args...), protocol.Costs(costs), lane), nil
	}))
	if err != nil {
		return 0, 0, err
	}
	if len(v) != 3 || v[1] < 0 || v[2] < 0 {
		return 0, 0, fmt.Errorf("%w: estimate %v", scriptreply.ErrReply, v)
	}
	return dur(v[1], time.Microsecond), int(v[2]), nil
}
