package lane

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/configerr"
	"github.com/sluicehq/sluice/internal/protocol"
)

// The bounds of sluice.Lane's fields.
const (
	MaxWeight   = 1_000_000
	MaxPriority = 1000
)

// Spec is a configured lane's weight (at least 1) and priority.
type Spec struct{ Weight, Priority int }

// Check checks a limiter's Config.Lanes and returns them by name; a
// refusal wraps errConfig (the package's configerr.New) and names the
// lane and what is wrong with it.
func Check(errConfig error, ls []sluice.Lane) (map[string]Spec, error) {
	if len(ls) == 0 {
		return nil, nil
	}
	m := make(map[string]Spec, len(ls))
	for i, l := range ls {
		if err := protocol.CheckLaneName(l.Name); err != nil {
			return nil, configerr.Invalid(errConfig, "Lanes[%d]: %v", i, err)
		}
		if _, dup := m[l.Name]; dup {
			return nil, configerr.Invalid(errConfig, "Lanes[%d]: lane %q listed twice", i, l.Name)
		}
		if l.Weight < 0 || l.Weight > MaxWeight {
			return nil, configerr.Invalid(errConfig, "Lanes[%d] (%q): Weight %d, want 0 (1) to %d", i, l.Name, l.Weight, MaxWeight)
		}
		if l.Priority < 0 || l.Priority > MaxPriority {
			return nil, configerr.Invalid(errConfig, "Lanes[%d] (%q): Priority %d, want 0 to %d", i, l.Name, l.Priority, MaxPriority)
		}
		m[l.Name] = Spec{Weight: max(l.Weight, 1), Priority: l.Priority}
	}
	return m, nil
}

// Suffix returns what the IDs of ctx's caller end with
// (protocol.LaneID): "" for the default lane (ctx names none), the lane
// of specs (Check's) or, for a lane not listed, of weight 1 and priority
// 0. A bad name is an error for the limiter to wrap with its name and
// sluice.ErrConfig.
func Suffix(ctx context.Context, specs map[string]Spec) (string, error) {
	name, ok := From(ctx)
	if !ok {
		return "", nil
	}
	if err := protocol.CheckLaneName(name); err != nil {
		return "", fmt.Errorf("WithLane: %v", err)
	}
	s, ok := specs[name]
	if !ok {
		s = Spec{Weight: 1}
	}
	return protocol.LaneID(name, s.Weight, s.Priority), nil
}
