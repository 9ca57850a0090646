package queueio

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

// The plain reads of a bucket's keys: no script, so they run under any
// configuration and never store one.

// ReadConfig reads the configuration in force of the bucket of keys; ok
// is false when none is stored yet.
func ReadConfig(ctx context.Context, rdb Client, keys Keys) (c protocol.Config, ok bool, err error) {
	raw, err := rdb.Get(ctx, keys.Config).Result()
	if errors.Is(err, redis.Nil) {
		return protocol.Config{}, false, nil
	}
	if err != nil {
		return protocol.Config{}, false, err
	}
	c, err = protocol.ParseConfig(raw)
	return c, err == nil, err
}

// Snapshot is a bucket as every process sees it, read in one round trip.
type Snapshot struct {
	Now      int64           // the Redis clock, µs
	Config   protocol.Config // in force; no policies when none is stored
	Stored   bool            // a configuration is stored
	State    protocol.BucketState
	HasState bool  // the state key exists (else the bucket is full and idle)
	Queued   int64 // callers queued, in every process and every lane
	Lock     string
	LockTTL  time.Duration // < 0: no lock
	// Windows holds each rolling policy's log, by the index of its
	// policy (nil for the others).
	Windows [][]protocol.WindowEntry
	// DefaultQueued is the default lane's callers; DefaultLanes the lanes
	// with callers a new caller of the default lane would share class 0
	// with, its own counted (1 without named lanes: LaneQueue.ClassLanes).
	DefaultQueued, DefaultLanes int64
	// Lanes are the lanes with callers while a named lane has some (the
	// default lane among them when it has callers), at most MaxLaneRows,
	// the most callers first; OtherLanes is how many more lanes have
	// callers, and OtherQueued their callers. They were read together,
	// by one script, just after the rest.
	Lanes                   []LaneQueue
	OtherLanes, OtherQueued int64
}

// Inspect reads the configuration, state, queue length and scheduler lock
// of the bucket of keys in one round trip (a pipeline of plain reads; on
// Cluster TIME may come from another node than the bucket's, good to a
// few ms), and, while named lanes have callers, the lanes in a second
// (lanes.lua, a script that only reads). mine are the policies this
// process runs under (a Queue's Options().Policies): their rolling
// windows' logs are read in the same round trip, and their number reads a
// state when no configuration is stored. It changes nothing.
func Inspect(ctx context.Context, rdb Client, keys Keys, mine []protocol.Policy) (Snapshot, error) {
	// The rolling windows' logs of the policies this process knows; of
	// another configuration in force, read again below.
	c, err := readSnapshot(ctx, rdb, keys, mine)
	if err != nil && !errors.Is(err, redis.Nil) {
		return Snapshot{}, err
	}
	s, err := parseSnapshot(c, len(mine))
	if err != nil {
		return Snapshot{}, err
	}
	ps := mine
	if s.Stored {
		ps = s.Config.Policies
	}
	if s.Windows, err = readWindows(ctx, rdb, keys, ps, c.logs); err != nil {
		return Snapshot{}, err
	}
	if c.lanes.Val() == 0 {
		return s, nil
	}
	l, err := readLanes(ctx, rdb, keys, MaxLaneRows)
	if err != nil {
		return Snapshot{}, err
	}
	s.Queued, s.DefaultQueued, s.DefaultLanes = l.defaultQueued+l.named, l.defaultQueued, l.defaultLanes
	s.Lanes, s.OtherLanes, s.OtherQueued = l.rows, l.others, l.othersQueued
	return s, nil
}

// snapshotReads are the commands of Inspect's round trip.
type snapshotReads struct {
	now        *redis.TimeCmd
	state, cfg *redis.StringCmd
	lock       *redis.StringCmd
	qlen       *redis.IntCmd
	lanes      *redis.IntCmd // named lanes have callers: 1
	ttl        *redis.DurationCmd
	logs       map[int]*redis.StringSliceCmd // by policy index, for the rolling policies of mine
}

// readSnapshot sends Inspect's round trip: the Redis clock, the
// configuration, the state, the queue's length, whether named lanes have
// callers, the lock and its TTL, and the logs of mine's rolling windows.
func readSnapshot(ctx context.Context, rdb Client, keys Keys, mine []protocol.Policy) (snapshotReads, error) {
	c := snapshotReads{logs: map[int]*redis.StringSliceCmd{}}
	_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		c.now = p.Time(ctx)
		c.cfg = p.Get(ctx, keys.Config)
		c.state = p.Get(ctx, keys.State)
		c.qlen = p.LLen(ctx, keys.Queue)
		c.lanes = p.Exists(ctx, keys.Classes)
		c.lock = p.Get(ctx, keys.Lock)
		c.ttl = p.PTTL(ctx, keys.Lock)
		for i, pol := range mine {
			if pol.Kind == protocol.Rolling {
				c.logs[i] = p.LRange(ctx, keys.Window+strconv.Itoa(i+1), 0, -1)
			}
		}
		return nil
	})
	return c, err
}

// parseSnapshot is the Snapshot c read, but its windows. known is how
// many policies this process knows, for a state when no configuration is
// stored.
func parseSnapshot(c snapshotReads, known int) (Snapshot, error) {
	s := Snapshot{Now: c.now.Val().UnixMicro(), Queued: c.qlen.Val(), DefaultQueued: c.qlen.Val(), DefaultLanes: 1, Lock: c.lock.Val(), LockTTL: -1}
	if c.ttl.Val() > 0 {
		s.LockTTL = c.ttl.Val()
	}
	if raw, err := c.cfg.Result(); err == nil {
		if s.Config, err = protocol.ParseConfig(raw); err != nil {
			return Snapshot{}, err
		}
		s.Stored = true
	}
	n := len(s.Config.Policies)
	if !s.Stored {
		n = known
	}
	if raw, err := c.state.Result(); err == nil {
		if s.State, err = protocol.ParseState(raw, n); err != nil {
			return Snapshot{}, err
		}
		s.HasState = true
	}
	return s, nil
}

// readWindows returns the logs of the rolling windows of ps, by policy
// index: from logs, read in Inspect's round trip, or, for a rolling
// window of the configuration in force only, read now.
func readWindows(ctx context.Context, rdb Client, keys Keys, ps []protocol.Policy, logs map[int]*redis.StringSliceCmd) ([][]protocol.WindowEntry, error) {
	windows := make([][]protocol.WindowEntry, len(ps))
	for i, pol := range ps {
		if pol.Kind != protocol.Rolling {
			continue
		}
		c, ok := logs[i]
		if !ok { // a rolling window of the configuration in force only
			if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				c = p.LRange(ctx, keys.Window+strconv.Itoa(i+1), 0, -1)
				return nil
			}); err != nil {
				return nil, err
			}
		}
		for _, r := range c.Val() {
			e, ok := protocol.ParseWindowEntry(r)
			if !ok {
				return nil, fmt.Errorf("%w: rolling window log entry %q", scriptreply.ErrReply, r)
			}
			windows[i] = append(windows[i], e)
		}
	}
	return windows, nil
}
