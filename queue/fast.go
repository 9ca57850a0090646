package queue

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
)

// The fast lane: a lone caller of a bucket far from its limit is granted
// by lua/fast.lua, which does enqueue.lua's work for that one case with
// 3 keys and 7 arguments (each argument costs Redis about 900
// instructions) and copies what it does not change: a third of the
// script's instructions. It is tried while the last caller this Queue
// sent alone was granted at once, so a guess that is wrong (the bucket
// has reached its limit) costs one more round trip once, then the
// callers take enqueue.lua again until one is granted at once.

// fastArgs is fast.lua's ARGV for one caller who may wait at most wait
// (0: only MaxWait bounds it), or nil when c is not its case: one token
// bucket policy counting calls.
func (q *Queue) fastArgs(c *conf, wait time.Duration) []any {
	if len(c.policies) != 1 || c.policies[0].Kind != protocol.TokenBucket || c.policies[0].Call() != 1 {
		return nil
	}
	limit := us(q.opt.MaxWait)
	if wait > 0 {
		if w := max(us(wait), 1); limit == 0 || w < limit {
			limit = w
		}
	}
	p := c.policies[0]
	return []any{c.id, p.Capacity, p.RefillAmount, p.RefillFrequency.Microseconds(), us(q.opt.Lookahead), limit, us(q.opt.Grace)}
}

// enqueueFast runs fast.lua for caller id (no costs of its own), and
// returns its reply; ok is false when the case was not fast.lua's, and
// nothing was written.
func (q *Queue) enqueueFast(ctx context.Context, c *conf, waits []time.Duration) (reply any, ok bool, err error) {
	var wait time.Duration
	if waits != nil {
		wait = waits[0]
	}
	args := q.fastArgs(c, wait)
	if args == nil {
		return nil, false, nil
	}
	reply, err = q.eval(ctx, fastScript, fastKeys(q.keys), args, true)
	if errors.Is(err, redis.Nil) {
		return nil, false, nil
	}
	return reply, true, err
}

// tryFast enqueues callers ids through the fast lane when it may serve
// them: one caller without costs, while the last caller this Queue sent
// alone was granted at once. ok is false when the caller is still to be
// enqueued.
func (q *Queue) tryFast(ctx context.Context, ids []string, costs [][]int64, waits []time.Duration) (rs []queueio.Arrival, ok bool, err error) {
	if len(ids) != 1 || costs != nil || !q.granting.Load() || protocol.IDLane(ids[0]) != "" {
		return nil, false, nil
	}
	reply, ok, err := q.enqueueFast(ctx, q.conf.Load(), waits)
	if !ok {
		return nil, false, err
	}
	rs, err = parseEnqueue(ids, []string{""}, reply, err)
	return rs, true, err
}
