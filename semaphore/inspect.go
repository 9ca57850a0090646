package semaphore

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/rediscall"
)

// Stats are this process's figures for one Semaphore (sluice.Stats):
// callers waiting in Acquire now, the weight its permits hold now (Held),
// the results of its calls since New, and the leases it lost while held
// (LeasesLost; not those Close ends). Inspect reads the semaphore's
// figures across every process.
type Stats = sluice.Stats

// Stats returns this process's figures. It does no I/O and is safe for
// concurrent use.
func (s *Semaphore) Stats() Stats {
	st := s.tally.Stats()
	st.Held = s.held.Load()
	st.LeasesLost = s.leasesLost.Load()
	st.Local, _, _ = s.localState()
	return st
}

var _ sluice.StatsReader = (*Semaphore)(nil)

// Inspection is a semaphore as every process sees it, read from Redis by
// Inspect.
type Inspection struct {
	// Now is the Redis clock when it was read.
	Now time.Time
	// Capacity is the capacity in force; this process's own (the one it
	// would store at its next call, as Capacity says) when none is stored
	// yet (Stored false).
	Capacity int
	Stored   bool
	// Held is the weight held now, in every process, and Holders the
	// permits that hold it. Held may be above Capacity for a while after
	// SetCapacity lowered it: it revokes nothing.
	Held, Holders int
	// Queued is the callers waiting, in every process and lane.
	// HeadWeight is the weight the first of them waits for (0 when none
	// waits): while it is above Capacity-Held, everyone behind it waits
	// too. With lanes (WithLane) the first is the head of the lane that
	// comes first by priority and finish tag (its floor aside: a lower
	// priority whose floor is due goes first).
	Queued, HeadWeight int
	// Expired counts leases, held or waiting, that ended without a
	// release and that no call has cleared yet: a process died or stalled.
	// They count in none of the figures above; the next call of any
	// process frees them.
	Expired int
	// Local reports that this process admits from its local share
	// (Config.Fallback) rather than from Redis, since LocalSince (local
	// clock), at 1/LocalShare of the capacity: a weight of
	// max(1, ⌊Capacity / LocalShare⌋), LocalShare being the processes
	// counted before the switch. Local lasts from the switch until this
	// process's waiters go back to Redis, 200 ms after it answers again.
	// Inspect fills these three even when it fails to read Redis, as it
	// does during an outage; LocalSince and LocalShare describe the last
	// switch, and are zero before the first.
	Local      bool
	LocalSince time.Time
	LocalShare int
}

//go:embed inspect.lua
var inspectSource string

var inspectScript = redis.NewScript(inspectSource)

// Inspect reads the semaphore's state across every process: the capacity
// in force, the weight and permits held, the callers queued and the weight
// the first of them waits for, and leases left by processes that died.
// One round trip of a script that only reads; it changes nothing, and
// never fails for a capacity this process does not follow. It returns an
// error naming the format for state written by a newer version, and an
// error wrapping Redis's when Redis did not answer. It also says whether
// this process runs on its local share (Config.Fallback), even when Redis
// cannot be read. It is safe for concurrent use, also after Close. Release returns before Redis has the
// release, so Inspect first waits until this process's own releases have
// been sent: it reads them back (another process's may lag by a round
// trip).
func (s *Semaphore) Inspect(ctx context.Context) (Inspection, error) {
	var local Inspection
	local.Local, local.LocalSince, local.LocalShare = s.localState()
	in, err := s.inspect(ctx)
	in.Local, in.LocalSince, in.LocalShare = local.Local, local.LocalSince, local.LocalShare
	return in, err
}

// inspect is Inspect's read of Redis.
func (s *Semaphore) inspect(ctx context.Context) (Inspection, error) {
	// Release returns before Redis has the release: read this process's
	// own releases back.
	if err := s.flush(ctx); err != nil {
		return Inspection{}, err
	}
	keys := []string{s.keys[0], s.keys[1], s.keys[3], s.keys[4], s.lanes}
	v, err := inspectScript.Run(ctx, s.rdb, keys).Result()
	if err != nil {
		return Inspection{}, rediscall.RedisError(ctx, "semaphore", s.cfg.Name, s.rdb, err, 0)
	}
	r, ok := v.([]interface{})
	if !ok || len(r) != 8 {
		return Inspection{}, fmt.Errorf("%w: inspect.lua returned %T %v", errReply, v, v)
	}
	now, ok := r[0].(int64)
	if !ok {
		return Inspection{}, fmt.Errorf("%w: inspect.lua returned time %v", errReply, r[0])
	}
	// holders, held, queued, head, expired
	var n [5]int64
	for i := range n {
		if n[i], ok = r[3+i].(int64); !ok || n[i] < 0 {
			return Inspection{}, fmt.Errorf("%w: inspect.lua returned %v", errReply, r)
		}
	}
	capacity, stored, err := s.parseStored(r[1], r[2])
	if err != nil {
		return Inspection{}, err
	}
	if !stored {
		s.mu.Lock()
		capacity = s.capacity
		s.mu.Unlock()
	}
	return Inspection{
		Now:        time.UnixMicro(now),
		Capacity:   capacity,
		Stored:     stored,
		Holders:    int(n[0]),
		Held:       int(n[1]),
		Queued:     int(n[2]),
		HeadWeight: int(n[3]),
		Expired:    int(n[4]),
	}, nil
}
