package bucket

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/configerr"
	"github.com/sluicehq/sluice/internal/lane"
	"github.com/sluicehq/sluice/internal/protocol"
)

// Lane describes a lane whose callers are served differently from the
// default (Config.Lanes): sluice.Lane, which the semaphore shares.
type Lane = sluice.Lane

const (
	maxLaneWeight   = 1_000_000
	maxLanePriority = 1000
)

// WithLane returns ctx carrying lane name: every call on ctx (Enter,
// EnterCost, Reserve, Do, TryEnter, Estimate, the transport's requests,
// a semaphore's Acquire) is in that lane. Within a lane callers are
// served in their order of arrival; between lanes, by weight and
// priority (Lane). A bad name (empty, longer than 128 bytes, with a
// space or '|') is an error sluice.ErrConfig from the call, and nothing
// is queued.
func WithLane(ctx context.Context, name string) context.Context {
	return lane.With(ctx, name)
}

// laneSpec is a configured lane's weight and priority.
type laneSpec struct{ weight, priority int }

// checkLanes checks Config.Lanes and returns them by name.
func checkLanes(ls []Lane) (map[string]laneSpec, error) {
	if len(ls) == 0 {
		return nil, nil
	}
	m := make(map[string]laneSpec, len(ls))
	for i, l := range ls {
		if err := protocol.CheckLaneName(l.Name); err != nil {
			return nil, configerr.Invalid(errConfig, "Lanes[%d]: %v", i, err)
		}
		if _, dup := m[l.Name]; dup {
			return nil, configerr.Invalid(errConfig, "Lanes[%d]: lane %q listed twice", i, l.Name)
		}
		if l.Weight < 0 || l.Weight > maxLaneWeight {
			return nil, configerr.Invalid(errConfig, "Lanes[%d] (%q): Weight %d, want 0 (1) to %d", i, l.Name, l.Weight, maxLaneWeight)
		}
		if l.Priority < 0 || l.Priority > maxLanePriority {
			return nil, configerr.Invalid(errConfig, "Lanes[%d] (%q): Priority %d, want 0 to %d", i, l.Name, l.Priority, maxLanePriority)
		}
		m[l.Name] = laneSpec{weight: max(l.Weight, 1), priority: l.Priority}
	}
	return m, nil
}

// laneOf returns what the IDs of ctx's caller end with
// (protocol.LaneID): "" for the default lane, or an error for a bad name.
func (b *Bucket) laneOf(ctx context.Context) (string, error) {
	name, ok := lane.From(ctx)
	if !ok {
		return "", nil
	}
	if err := protocol.CheckLaneName(name); err != nil {
		return "", fmt.Errorf("bucket %q: WithLane: %v (%w)", b.cfg.Name, err, sluice.ErrConfig)
	}
	s, ok := b.cfg.lanes[name]
	if !ok {
		s = laneSpec{weight: 1}
	}
	return protocol.LaneID(name, s.weight, s.priority), nil
}

// defaultLookahead is Lookahead's default: 20 ms, or, when a lane has a
// priority, the time the fastest policy takes to add one token, within
// 1 ms and 20 ms. The slots a step hands out go up to a lookahead ahead,
// so that is how long a caller of a higher priority may find them given
// to lower lanes before its own (docs/lanes.md).
func (c Config) defaultLookahead() time.Duration {
	if !slices.ContainsFunc(c.Lanes, func(l Lane) bool { return l.Priority > 0 }) {
		return defaultLookahead
	}
	d := defaultLookahead
	ps := c.Policies
	if c.RefillAmount > 0 {
		ps = append([]Policy{{RefillAmount: c.RefillAmount, RefillFrequency: c.RefillFrequency}}, ps...)
	}
	for _, p := range ps {
		if p.RefillAmount > 0 {
			d = min(d, p.RefillFrequency/time.Duration(p.RefillAmount))
		}
	}
	return max(d, time.Millisecond)
}

// eventLane is the lane of ctx's caller for its sluice.Event: "" for the
// default lane and for a bad name (the call failed; a metric label must
// be a name the bucket accepts).
func eventLane(ctx context.Context) string {
	name, ok := lane.From(ctx)
	if !ok || protocol.CheckLaneName(name) != nil {
		return ""
	}
	return name
}
