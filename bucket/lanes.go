package bucket

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/lane"
	"github.com/sluicehq/sluice/internal/protocol"
)

// Lane describes a lane whose callers are served differently from the
// default (Config.Lanes): sluice.Lane, which the semaphore shares.
type Lane = sluice.Lane

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

// laneOf returns what the IDs of ctx's caller end with
// (protocol.LaneID): "" for the default lane, or an error for a bad name.
func (b *Bucket) laneOf(ctx context.Context) (string, error) {
	sfx, err := lane.Suffix(ctx, b.cfg.lanes)
	if err != nil {
		return "", fmt.Errorf("bucket %q: %v (%w)", b.cfg.Name, err, sluice.ErrConfig)
	}
	return sfx, nil
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
