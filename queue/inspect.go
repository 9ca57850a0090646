package queue

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/scriptreply"
)

// Snapshot is a bucket as every process sees it, read in one round trip.
type Snapshot struct {
	Now      int64  // the Redis clock, µs
	Config   Config // in force; no policies when none is stored
	Stored   bool   // a configuration is stored
	State    protocol.BucketState
	HasState bool  // the state key exists (else the bucket is full and idle)
	Queued   int64 // callers queued, in every process
	Lock     string
	LockTTL  time.Duration // < 0: no lock
	// Windows holds each rolling policy's log, by the index of its
	// policy (nil for the others).
	Windows [][]protocol.WindowEntry
}

// Inspect reads the bucket's configuration, state, queue length and
// scheduler lock in one round trip (a pipeline of plain reads; on Cluster
// TIME may come from another node than the bucket's, good to a few ms).
// It changes nothing.
func (q *Queue) Inspect(ctx context.Context) (Snapshot, error) {
	var (
		now        *redis.TimeCmd
		state, cfg *redis.StringCmd
		lock       *redis.StringCmd
		qlen       *redis.IntCmd
		ttl        *redis.DurationCmd
		logs       = map[int]*redis.StringSliceCmd{}
	)
	// The rolling windows' logs of the policies this process knows; of
	// another configuration in force, read again below.
	mine := q.conf.Load().policies
	_, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		now = p.Time(ctx)
		cfg = p.Get(ctx, q.keys.config)
		state = p.Get(ctx, q.keys.state)
		qlen = p.LLen(ctx, q.keys.Queue)
		lock = p.Get(ctx, q.keys.Lock)
		ttl = p.PTTL(ctx, q.keys.Lock)
		for i, pol := range mine {
			if pol.Kind == protocol.Rolling {
				logs[i] = p.LRange(ctx, q.keys.window+strconv.Itoa(i+1), 0, -1)
			}
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return Snapshot{}, err
	}
	s := Snapshot{Now: now.Val().UnixMicro(), Queued: qlen.Val(), Lock: lock.Val(), LockTTL: -1}
	if ttl.Val() > 0 {
		s.LockTTL = ttl.Val()
	}
	if raw, err := cfg.Result(); err == nil {
		if s.Config, err = protocol.ParseConfig(raw); err != nil {
			return Snapshot{}, err
		}
		s.Stored = true
	}
	n := len(s.Config.Policies)
	if !s.Stored {
		n = len(q.conf.Load().policies)
	}
	if raw, err := state.Result(); err == nil {
		if s.State, err = protocol.ParseState(raw, n); err != nil {
			return Snapshot{}, err
		}
		s.HasState = true
	}
	ps := mine
	if s.Stored {
		ps = s.Config.Policies
	}
	s.Windows = make([][]protocol.WindowEntry, len(ps))
	for i, pol := range ps {
		if pol.Kind != protocol.Rolling {
			continue
		}
		c, ok := logs[i]
		if !ok { // a rolling window of the configuration in force only
			if _, err := q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				c = p.LRange(ctx, q.keys.window+strconv.Itoa(i+1), 0, -1)
				return nil
			}); err != nil {
				return Snapshot{}, err
			}
		}
		raw := c.Val()
		for _, r := range raw {
			e, ok := protocol.ParseWindowEntry(r)
			if !ok {
				return Snapshot{}, fmt.Errorf("%w: rolling window log entry %q", scriptreply.ErrReply, r)
			}
			s.Windows[i] = append(s.Windows[i], e)
		}
	}
	return s, nil
}
