package bucket

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
)

// Inspection is a bucket as every process sees it, read from Redis by
// Inspect.
type Inspection struct {
	// Now is the Redis clock when it was read.
	Now time.Time
	// Policies are the policies in force; this process's own when none
	// are stored yet (Stored false).
	Policies []Policy
	Stored   bool
	// Adapting is the share of the configured rate in force while
	// Config.Adapt has slowed it (0.85, 0.9, ...); 0 when it has not.
	Adapting float64
	// Levels are each policy's tokens, refilled to Now (during a hold, a
	// held policy's tokens at the hold's end).
	Levels []Level
	// Queued is the callers waiting in the queue, in every process and
	// every lane.
	Queued int
	// Wait is how long a new caller of Enter's cost in the default lane
	// would wait for its slot (Estimate's answer for it).
	Wait time.Duration
	// Lanes are the lanes with callers (WithLane) while any named lane
	// has callers, the default lane among them when it has callers: at
	// most 20, those with the most callers first (then the higher
	// priority, then the name). OtherLanes is how many more lanes have
	// callers, and OtherQueued how many callers wait in them. All three
	// are empty while no named lane has callers.
	Lanes                   []LaneInspection
	OtherLanes, OtherQueued int
	// Scheduler names the process running the scheduler ("host:pid"),
	// "" when none runs; SchedulerTTL is how long its lock lasts unless
	// renewed.
	Scheduler    string
	SchedulerTTL time.Duration
	// Format is the state's format version (0: no state, the bucket is
	// full and idle, or written before versions).
	Format int
	// HeldUntil is the end of a hold (Hold, Feedback) still in force; the
	// zero time when none.
	HeldUntil time.Time
	// Local reports that this process admits from its local share
	// (Config.Fallback) because Redis could not be reached, since
	// LocalSince (local clock), at 1/LocalShare of the limit. Inspect
	// fills these three even when it fails to read Redis, as it does
	// during an outage.
	Local      bool
	LocalSince time.Time
	LocalShare int
}

// LaneInspection is one lane with callers at an Inspection.
type LaneInspection struct {
	// Name is the lane's name, "" for the default lane.
	Name string
	// Priority is the lane's priority (Lane.Priority) as its callers
	// were queued; 0 for the default lane.
	Priority int
	// Queued is the callers waiting in the lane, in every process.
	Queued int
	// Wait is how long a new caller of Enter's cost in the lane would
	// wait for its slot (Estimate's answer for it): the lane's callers
	// ahead of it, each served once in every turn of the lanes of its
	// priority that have callers, at the bucket's full rate.
	Wait time.Duration
}

// Level is one policy's tokens at an Inspection.
type Level struct {
	// Tokens are free now; negative: owed to slots already handed out.
	Tokens int64
	// NextRefill is how long until the next refill (0 when full); of a
	// rolling window, until its oldest grant in the window leaves it.
	NextRefill time.Duration
}

// Inspect reads the bucket's state across every process: the policies in
// force and each one's tokens, the callers queued, the wait a new caller
// would have, the lanes with callers, and which process runs the
// scheduler. One round trip of plain reads, and while named lanes have
// callers a second, a script that reads the lanes at once (its work grows
// with the lanes that have callers, not with the idle ones); it changes
// nothing and never fails for a configuration this process does not
// follow. It also says whether this process runs on its local share
// (Config.Fallback), even when Redis cannot be read. It is safe for
// concurrent use.
func (b *Bucket) Inspect(ctx context.Context) (Inspection, error) {
	var local Inspection
	local.Local, local.LocalSince, local.LocalShare = b.fb.state()
	s, err := queueio.Inspect(ctx, b.reads, b.keys, b.q.Options().Policies)
	if err != nil {
		return local, b.redisErr(ctx, err)
	}
	qps := s.Config.Policies
	if !s.Stored {
		qps = b.q.Options().Policies
	}
	in := Inspection{
		Now:         time.UnixMicro(s.Now),
		Policies:    fromQueue(qps),
		Stored:      s.Stored,
		Queued:      int(s.Queued),
		Scheduler:   protocol.LockHolder(s.Lock),
		Format:      int(s.State.Format),
		OtherLanes:  int(s.OtherLanes),
		OtherQueued: int(s.OtherQueued),
		Local:       local.Local, LocalSince: local.LocalSince, LocalShare: local.LocalShare,
	}
	if len(s.Config.Base) > 0 && s.Config.Factor > 0 && s.Config.Factor < 1 {
		in.Adapting = s.Config.Factor
	}
	if s.LockTTL > 0 {
		in.SchedulerTTL = s.LockTTL
	}
	ats := make([]policyAt, len(qps))
	for i, p := range qps {
		var lv Level
		lv, ats[i] = inspectPolicy(s, i, p)
		in.Levels = append(in.Levels, lv)
	}
	if s.State.Hold > s.Now {
		in.HeldUntil = time.UnixMicro(s.State.Hold)
	}
	in.Wait = inspectWait(s, qps, ats, s.DefaultQueued, s.DefaultLanes)
	for _, l := range s.Lanes {
		in.Lanes = append(in.Lanes, LaneInspection{Name: l.Name, Priority: l.Priority, Queued: int(l.Queued),
			Wait: inspectWait(s, qps, ats, l.Queued, l.ClassLanes)})
	}
	return in, nil
}

// policyAt is what a new caller's slot under one policy follows from, at
// an Inspection: the policy's level and its anchor (or its rolling
// window's log) refilled to then, and the extra tokens the callers queued
// with costs of their own take beyond a call's.
type policyAt struct {
	level, anchor, extra int64
	log                  []protocol.WindowEntry
}

// inspectPolicy is Inspect's figures for policy i, p, of the snapshot s:
// its level, and what a new caller's slot under it follows from.
func inspectPolicy(s queueio.Snapshot, i int, p protocol.Policy) (Level, policyAt) {
	a := policyAt{level: p.Capacity, anchor: s.Now}
	if s.HasState && i < len(s.State.Levels) {
		l := s.State.Levels[i]
		a.level, a.anchor = protocol.Refill(l.Level, l.Anchor, s.Now, p)
		if p.Kind == protocol.Rolling && i < len(s.Windows) {
			a.level, a.log = protocol.WindowRefill(l.Level, s.Windows[i], s.Now, p)
		}
		if s.Queued > 0 && i < len(s.State.Extra) {
			a.extra = s.State.Extra[i]
		}
	}
	lv := Level{Tokens: a.level}
	switch {
	case a.level >= p.Capacity:
	case p.Kind == protocol.Rolling && len(a.log) > 0:
		lv.NextRefill = time.Duration(a.log[0].Slot+protocol.WindowSpan(p)+1-s.Now) * time.Microsecond
	case p.Kind != protocol.Rolling:
		lv.NextRefill = time.Duration(a.anchor+p.RefillFrequency.Microseconds()-s.Now) * time.Microsecond
	}
	return lv, a
}

// inspectWait is the wait for its slot of a new caller of Enter's cost in
// a lane of queued callers that shares its priority with lanes-1 other
// lanes with callers (lanes 1: no named lane has callers), under the
// policies qps at ats: as queue/lua/estimate.lua counts it, the lane's
// callers and the caller itself served once in every turn of the lanes,
// (queued+1)×lanes−1 callers ahead of it.
func inspectWait(s queueio.Snapshot, qps []protocol.Policy, ats []policyAt, queued, lanes int64) time.Duration {
	ahead := (queued+1)*max(lanes, 1) - 1
	slot := s.Now
	for i, p := range qps {
		a := ats[i]
		k := ahead*p.Call() + a.extra + p.Call()
		if p.Kind == protocol.Rolling {
			slot = max(slot, protocol.WindowSlot(a.level, a.log, s.Now, k, p))
		} else {
			slot = max(slot, protocol.SlotFor(a.level, a.anchor, s.Now, k, p))
		}
		if k > 0 && s.State.Holds(i, s.Now) { // tokens.lua's slot_k: held back to the hold
			slot = max(slot, s.State.Hold)
		}
	}
	return time.Duration(slot-s.Now) * time.Microsecond
}

// Estimate is what a caller would meet if it entered now.
type Estimate struct {
	Wait  time.Duration // until its slot: 0 if it would start at once
	Ahead int           // callers queued ahead of it, in every process
}

// Estimate says, without taking anything, how long a caller of cost c
// would wait if it entered now, counting the callers already queued in
// every process and their costs. The wait is exact unless callers ahead
// give up (then it is shorter) or the caller would be refused (MaxQueue,
// MaxWait). A cost is checked as EnterCost checks it; nil is Enter's
// (1 call; an error on a bucket none of whose policies counts calls).
// One round trip.
func (b *Bucket) Estimate(ctx context.Context, c Cost) (Estimate, error) {
	for settled := 0; ; settled++ {
		costs, stop, err := b.costsOf(ctx, c) // nil: Enter's
		// stop: a bad cost, or one that takes nothing (it would not wait).
		if stop {
			return Estimate{}, err
		}
		sfx, err := b.laneOf(ctx)
		if err != nil {
			return Estimate{}, err
		}
		wait, ahead, err := b.q.Estimate(ctx, sfx, costs)
		retry, serr := b.followInForce(ctx, err, settled)
		switch {
		case retry:
			continue
		case serr != nil:
			return Estimate{}, serr
		case err != nil:
			return Estimate{}, b.redisErr(ctx, err)
		}
		return Estimate{Wait: wait, Ahead: ahead}, nil
	}
}
