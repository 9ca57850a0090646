package queue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Policy is one limit of a bucket: it holds at most Capacity tokens and gains
// Amount tokens every Every. Every is used in whole microseconds.
type Policy struct {
	Capacity int64
	Amount   int64
	Every    time.Duration
}

// Options tune a Queue. Durations are used in whole microseconds.
type Options struct {
	Lookahead time.Duration // slots within this are given at once; the scheduler schedules this far ahead
	LockTTL   time.Duration // the scheduler lock's TTL, renewed by every step
	Grace     time.Duration // added to every key's TTL; uncollected slots are dropped after it
	Tolerance time.Duration // a slot older than this when polled is stale; < 0: never
	Lead      time.Duration // callers poll this long before their estimated slot
	MaxQueue  int           // refuse new callers when this many wait; 0: unbounded
	MaxWait   time.Duration // refuse new callers whose estimated wait exceeds it; 0: unbounded
	MaxBatch  int           // most callers one step schedules; 0: 1000
}

// ErrReply reports a script reply of an unexpected shape.
var ErrReply = errors.New("queue: unexpected script reply")

// Queue runs the scripts of one bucket. It is safe for concurrent use.
type Queue struct {
	rdb  redis.Scripter
	keys Keys
	opt  Options

	// direct is rdb when it is one server (*redis.Client): then a poll is
	// first TIME and GETDEL in one pipeline, which costs Redis a fraction
	// of a script. On Cluster or Ring, TIME could reach another node than
	// the slot key, with another clock, so polls stay scripts.
	direct *redis.Client

	policyArgs []any // "n, cap, amount, freq µs, ..." as the scripts read them
	policies   []Policy
	noPush     atomic.Bool // the server refused the push lane's transaction
}

// New returns the Queue of the bucket name under prefix. It does not talk to
// Redis; see Load.
func New(rdb redis.Scripter, prefix, name string, policies []Policy, opt Options) *Queue {
	if opt.MaxBatch <= 0 {
		opt.MaxBatch = 1000
	}
	args := []any{len(policies)}
	for _, p := range policies {
		args = append(args, p.Capacity, p.Amount, p.Every.Microseconds())
	}
	q := &Queue{rdb: rdb, keys: NewKeys(prefix, name), opt: opt, policyArgs: args, policies: policies}
	if c, ok := rdb.(*redis.Client); ok && c != nil {
		q.direct = c
	}
	return q
}

// Keys returns the bucket's keys.
func (q *Queue) Keys() Keys { return q.keys }

// Load loads every script into Redis, so that later calls need one round
// trip each, and reports whether Redis is reachable.
func (q *Queue) Load(ctx context.Context) error {
	for _, s := range allScripts {
		if err := s.Load(ctx, q.rdb).Err(); err != nil {
			return err
		}
	}
	return nil
}

func us(d time.Duration) int64 { return d.Microseconds() }

// Outcome of Enqueue.
type EnqueueKind int

const (
	Granted     EnqueueKind = iota // start now
	Assigned                       // start after Delay
	Queued                         // wait in the queue; Delay estimates the slot
	QueueFull                      // refused: MaxQueue callers wait already
	WaitTooLong                    // refused: Delay, the estimated wait, exceeds MaxWait
)

// EnqueueReply is what Enqueue learned.
type EnqueueReply struct {
	Kind             EnqueueKind
	Delay            time.Duration // see Kind; relative to Redis time when the script ran
	Position         int           // 1-based place in the queue (Queued and WaitTooLong)
	SchedulerRunning bool          // Queued: the scheduler lock was held
	Ticket           int64         // arrival order at Redis (granted and queued callers)
	Slot             int64         // Granted, Assigned: the slot, µs on the Redis clock (for analysis only)
	Now              int64         // the Redis clock (µs) when the call read it: Delay is from then
	// Entry is how a Queued caller is known from now on: pass it to Poll
	// and Cancel. It is "<id>|<estimated slot>".
	Entry string
}

// Enqueue makes caller id arrive at the bucket.
func (q *Queue) Enqueue(ctx context.Context, id string) (EnqueueReply, error) {
	r, err := q.EnqueueBatch(ctx, []string{id})
	if err != nil {
		return EnqueueReply{}, err
	}
	return r[0], nil
}

// EnqueueBatch makes callers arrive at the bucket in one round trip, in the
// order given, each handled as if it had come alone.
func (q *Queue) EnqueueBatch(ctx context.Context, ids []string) ([]EnqueueReply, error) {
	args := make([]any, 0, 4+len(q.policyArgs)+1+len(ids))
	args = append(args, us(q.opt.Lookahead), q.opt.MaxQueue, us(q.opt.MaxWait), us(q.opt.Grace))
	args = append(args, q.policyArgs...)
	args = append(args, len(ids))
	for _, id := range ids {
		args = append(args, id)
	}
	reply, err := enqueueScript.Run(ctx, q.rdb, q.keys.list()[:2], args...).Result()
	return parseEnqueue(ids, reply, err)
}

// parseEnqueue checks an enqueue reply for callers ids.
func parseEnqueue(ids []string, reply any, err error) ([]EnqueueReply, error) {
	v, err := ints(reply, err)
	if err != nil {
		return nil, err
	}
	n := len(ids)
	if len(v) != 3+3*n {
		return nil, fmt.Errorf("%w: enqueue of %d callers gave %d values", ErrReply, n, len(v))
	}
	now, running, ticket := v[0], v[1] == 1, v[2]
	out := make([]EnqueueReply, n)
	for i := range out {
		e := v[3+3*i : 6+3*i]
		kind, delay := EnqueueKind(e[0]), e[1]
		if kind < Granted || kind > WaitTooLong || e[2] < 0 {
			return nil, fmt.Errorf("%w: enqueue %v", ErrReply, e)
		}
		r := EnqueueReply{Kind: kind, Delay: dur(delay, time.Microsecond), Position: int(e[2]), Now: now}
		switch kind {
		case Granted, Assigned:
			r.Ticket, r.Slot = ticket, now+delay
			ticket++
		case Queued:
			r.Ticket, r.SchedulerRunning = ticket, running
			r.Entry = ids[i] + "|" + strconv.FormatInt(now+delay, 10)
			ticket++
		}
		out[i] = r
	}
	return out, nil
}

// StepStatus is what a scheduler step decided.
type StepStatus int

const (
	Fenced   StepStatus = -1 // the lock is not held by this token: stop
	Released StepStatus = 0  // the queue is empty and the lock was released
	Running  StepStatus = 1  // callers still wait: step again after Next
)

// StepReply is what Step did.
type StepReply struct {
	Status    StepStatus
	Next      time.Duration // Running: when the next caller enters the lookahead
	Waiting   int           // callers still queued
	Scheduled int           // callers given a slot by this step
}

// Step runs one scheduler step as the holder of the lock token.
func (q *Queue) Step(ctx context.Context, token string) (StepReply, error) {
	args := append([]any{token, q.opt.LockTTL.Milliseconds(), us(q.opt.Lookahead), q.opt.MaxBatch, us(q.opt.Grace), us(q.opt.Lead), q.keys.Wake}, q.policyArgs...)
	return parseStep(stepScript.Run(ctx, q.rdb, q.keys.list(), args...).Result())
}

// parseStep checks a step reply.
func parseStep(reply any, err error) (StepReply, error) {
	v, err := ints(reply, err)
	if err != nil {
		return StepReply{}, err
	}
	if len(v) != 4 || v[0] < -1 || v[0] > 1 {
		return StepReply{}, fmt.Errorf("%w: step %v", ErrReply, v)
	}
	return StepReply{
		Status:    StepStatus(v[0]),
		Next:      dur(v[1], time.Microsecond),
		Waiting:   int(v[2]),
		Scheduled: int(v[3]),
	}, nil
}

// PollKind is what a poll found.
type PollKind int

const (
	Slot    PollKind = 1 // a slot: start after Delay (negative: late)
	Waiting PollKind = 2 // still queued; Delay estimates the slot
	Stale   PollKind = 3 // the slot passed more than Tolerance ago; the token is spent
	Lost    PollKind = 4 // the ID is neither queued nor scheduled
)

// PollReply is what Poll found.
type PollReply struct {
	Kind     PollKind
	Delay    time.Duration // see Kind
	Position int           // Waiting: 1-based place in the queue
	LockTTL  time.Duration // Waiting: the scheduler lock's remaining TTL, < 0 if none
	Slot     int64         // Slot: the slot, µs on the Redis clock (for analysis only)
	// RoundTrips is how many round trips the poll took: 1, or 2 when the
	// direct poll found no slot and the script ran after it.
	RoundTrips int
}

// Poll asks for the slot of the caller queued as entry, consuming it if
// found. On one server it first tries TIME and GETDEL of the slot key in
// one pipeline; only when no slot is there yet (or on Cluster) does it run
// the poll script, which also tells where in the queue the caller is.
func (q *Queue) Poll(ctx context.Context, entry string) (PollReply, error) {
	tol := us(q.opt.Tolerance)
	if q.opt.Tolerance < 0 {
		tol = 1 << 52 // never stale
	}
	trips := 0
	if q.direct != nil {
		trips++
		r, found, err := q.pollDirect(ctx, entry, tol)
		if err != nil || found {
			r.RoundTrips = trips
			return r, err
		}
	}
	args := append([]any{entry, tol}, q.policyArgs...)
	r, err := parsePoll(pollScript.Run(ctx, q.rdb, q.keys.list(), args...).Result())
	r.RoundTrips = trips + 1
	return r, err
}

// pollDirect is the script's first branch in plain commands: a slot key,
// once written, is only ever read and deleted by its own caller's poll, so
// TIME need not run atomically with GETDEL; the pipeline only has to reach
// the one server whose clock wrote the slot.
func (q *Queue) pollDirect(ctx context.Context, entry string, tol int64) (PollReply, bool, error) {
	var now *redis.TimeCmd
	var slot *redis.StringCmd
	_, err := q.direct.Pipelined(ctx, func(p redis.Pipeliner) error {
		now = p.Time(ctx)
		slot = p.GetDel(ctx, q.keys.SlotKey(entry))
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return PollReply{}, false, err
	}
	if errors.Is(slot.Err(), redis.Nil) {
		return PollReply{}, false, nil
	}
	s, err := slot.Int64()
	if err != nil {
		return PollReply{}, false, fmt.Errorf("%w: slot key holds %q", ErrReply, slot.Val())
	}
	d := s - now.Val().UnixMicro()
	if d < -tol {
		return PollReply{Kind: Stale, Delay: dur(d, time.Microsecond)}, true, nil
	}
	return PollReply{Kind: Slot, Delay: dur(d, time.Microsecond), Slot: s}, true, nil
}

// parsePoll checks a poll reply.
func parsePoll(reply any, err error) (PollReply, error) {
	v, err := ints(reply, err)
	if err != nil {
		return PollReply{}, err
	}
	if len(v) != 5 || v[0] < 1 || v[0] > 4 {
		return PollReply{}, fmt.Errorf("%w: poll %v", ErrReply, v)
	}
	r := PollReply{
		Kind:     PollKind(v[0]),
		Delay:    dur(v[1], time.Microsecond),
		Position: int(v[2]),
		LockTTL:  dur(v[3], time.Millisecond),
		Slot:     v[4],
	}
	if v[3] < 0 {
		r.LockTTL = -1
	}
	return r, nil
}

// CancelResult is what Cancel found.
type CancelResult int

const (
	Removed  CancelResult = 0 // left the queue before it had a slot: no token spent
	Forfeit  CancelResult = 1 // it had a slot: that token is spent
	NotFound CancelResult = 2 // unknown ID
)

// Cancel takes the caller queued as entry out of the bucket.
func (q *Queue) Cancel(ctx context.Context, entry string) (CancelResult, error) {
	r, err := q.CancelBatch(ctx, []string{entry})
	if err != nil {
		return 0, err
	}
	return r[0], nil
}

// CancelBatch takes several callers out of the bucket in one round trip.
func (q *Queue) CancelBatch(ctx context.Context, entries []string) ([]CancelResult, error) {
	args := make([]any, len(entries))
	for i, e := range entries {
		args[i] = e
	}
	reply, err := cancelScript.Run(ctx, q.rdb, []string{q.keys.Queue, q.keys.Slot, q.keys.State}, args...).Result()
	return parseCancel(len(entries), reply, err)
}

// parseCancel checks a cancel reply for n callers.
func parseCancel(n int, reply any, err error) ([]CancelResult, error) {
	v, err := ints(reply, err)
	if err != nil {
		return nil, err
	}
	if len(v) != n {
		return nil, fmt.Errorf("%w: cancel of %d callers gave %d values", ErrReply, n, len(v))
	}
	out := make([]CancelResult, n)
	for i, x := range v {
		if x < 0 || x > 2 {
			return nil, fmt.Errorf("%w: cancel %v", ErrReply, v)
		}
		out[i] = CancelResult(x)
	}
	return out, nil
}

// dur converts a reply's count of unit into a Duration, saturating instead
// of wrapping past ±292 years (a valid config can ask for longer).
func dur(n int64, unit time.Duration) time.Duration {
	const maxDur = time.Duration(1<<63 - 1)
	switch {
	case n > int64(maxDur/unit):
		return maxDur
	case n < -int64(maxDur/unit):
		return -maxDur
	}
	return time.Duration(n) * unit
}

// ints checks that a script reply is a list of integers.
func ints(v any, err error) ([]int64, error) {
	if err != nil {
		return nil, err
	}
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("%w: %T", ErrReply, v)
	}
	out := make([]int64, len(list))
	for i, e := range list {
		n, ok := e.(int64)
		if !ok {
			return nil, fmt.Errorf("%w: element %d is %T", ErrReply, i, e)
		}
		out[i] = n
	}
	return out, nil
}

// Slots returns the slots written and not yet collected, by caller ID (µs,
// Redis time). It SCANs the server for the bucket's slot keys: for tests
// and diagnosis, not for a hot path. On Cluster, pass the client of the
// node that holds the bucket's slot.
func Slots(ctx context.Context, rdb redis.Cmdable, k Keys) (map[string]int64, error) {
	out := map[string]int64{}
	iter := rdb.Scan(ctx, 0, k.SlotPattern(), 1000).Iterator()
	for iter.Next(ctx) {
		key := iter.Val()
		v, err := rdb.Get(ctx, key).Int64()
		if errors.Is(err, redis.Nil) {
			continue // collected or expired meanwhile
		}
		if err != nil {
			return nil, err
		}
		out[strings.TrimPrefix(key, k.Slot)] = v
	}
	return out, iter.Err()
}
