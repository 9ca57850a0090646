package semaphore

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/lane"
)

// WithLane returns ctx carrying lane name: an Acquire, AcquireN or Do on
// ctx waits in that lane. It is bucket.WithLane: a ctx made by either
// names the lane for both. Within a lane waiters are served in their
// order of arrival; between lanes, by weight (counted in permits: a
// waiter of weight 3 counts 3) and priority (sluice.Lane, Config.Lanes).
// A bad name (empty, longer than 128 bytes, with a space or '|') is an
// error sluice.ErrConfig from the call, and nothing is queued.
func WithLane(ctx context.Context, name string) context.Context {
	return lane.With(ctx, name)
}

// laneOf returns what the ids of ctx's waiter end with (protocol.LaneID):
// "" for the default lane, or an error for a bad name.
func (s *Semaphore) laneOf(ctx context.Context) (string, error) {
	sfx, err := lane.Suffix(ctx, s.cfg.lanes)
	if err != nil {
		return "", fmt.Errorf("semaphore %q: %v (%w)", s.cfg.Name, err, sluice.ErrConfig)
	}
	return sfx, nil
}
