package queue

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Replicas: closing the failover gap. Redis replicates asynchronously, so
// a replica promoted after its master died may not have heard of the last
// grants, and hands their tokens out again (docs/guarantees.md,
// "Failover"). With queueio.Options.Replicas > 0, every call whose reply
// may grant a caller its slot (an arrival, a poll) is followed on the same
// connection by WAIT Replicas ReplicaTimeout, in one pipeline: replication
// is one stream, so once the replicas acknowledged the offset of this
// connection's last write, they hold every write before it, the step that
// wrote the slot included. A grant whose writes fall short is not handed
// to its caller: ErrNotReplicated. Its token is spent, which errs on the
// safe side. Scripts cannot call WAIT themselves.

// ErrNotReplicated reports that a grant's writes were not acknowledged by
// queueio.Options.Replicas replicas within ReplicaTimeout: the caller must
// not start (its token is spent).
var ErrNotReplicated = errors.New("queue: the grant was not acknowledged by enough replicas")

// eval runs script s; when grants and Replicas > 0, with WAIT after it on
// the same connection.
func (q *Queue) eval(ctx context.Context, s *redis.Script, keys []string, args []any, grants bool) (any, error) {
	if !grants || q.opt.Replicas <= 0 {
		return s.Run(ctx, q.rdb, keys, args...).Result()
	}
	for try := 0; ; try++ {
		var ev *redis.Cmd
		var acks *redis.Cmd
		_, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
			ev = p.EvalSha(ctx, s.Hash(), keys, args...)
			acks = q.wait(ctx, p)
			return nil
		})
		if try == 0 && redis.HasErrorPrefix(ev.Err(), "NOSCRIPT") {
			if err := s.Load(ctx, q.rdb).Err(); err != nil {
				return nil, err
			}
			continue
		}
		reply, rerr := ev.Result()
		if rerr != nil {
			return reply, rerr
		}
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, err
		}
		return reply, q.acked(acks)
	}
}

// wait queues WAIT in p when Replicas > 0; nil otherwise.
func (q *Queue) wait(ctx context.Context, p redis.Pipeliner) *redis.Cmd {
	if q.opt.Replicas <= 0 {
		return nil
	}
	return p.Do(ctx, "WAIT", q.opt.Replicas, max(q.opt.ReplicaTimeout.Milliseconds(), 1))
}

// acked checks WAIT's reply (nil: not asked).
func (q *Queue) acked(acks *redis.Cmd) error {
	if acks == nil {
		return nil
	}
	n, err := acks.Int64()
	if err != nil {
		return err
	}
	if n < int64(q.opt.Replicas) {
		return fmt.Errorf("%w: %d of %d within %v", ErrNotReplicated, n, q.opt.Replicas, q.opt.ReplicaTimeout)
	}
	return nil
}
