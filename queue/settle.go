package queue

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/scriptreply"
)

//go:embed lua/settle.lua
var settleLua string

var settleScript = protocol.Script(settleLua, protocol.TokensLua, protocol.StateLua, protocol.EntryLua)

// Settled is what Settle did, in tokens summed over the policies.
type Settled struct {
	Back int64 // given back to the bucket
	Lost int64 // not given back: the bucket was full
	Debt int64 // taken beyond the estimate
}

// Settle corrects every policy at once by diffs, the true cost of a call
// less the estimate it was granted with, one per policy in the order of
// the configuration id names (lua/settle.lua): a negative difference goes
// back to the bucket (up to each policy's capacity), a positive one is
// taken as a debt the callers after it wait out. slot is the grant's (µs
// on the Redis clock, 0 if unknown), which a rolling window's give-back
// needs. When the configuration in force is another, Settle changes
// nothing and returns a *ConfigError. One round trip.
func (q *Queue) Settle(ctx context.Context, id string, slot int64, diffs []int64) (Settled, error) {
	reply, err := q.run(ctx, settleScript, q.keys.retime(), func(c *conf) ([]any, error) {
		if c.id != id || len(diffs) != len(c.policies) {
			return nil, &ConfigError{mine: id}
		}
		args := []any{us(q.opt.Grace), protocol.Costs(diffs), max(slot, 0)}
		return append(args, c.args...), nil
	})
	v, err := scriptreply.Ints(reply, err)
	if err != nil {
		return Settled{}, err
	}
	if len(v) != 3 || v[0] < 0 || v[1] < 0 || v[2] < 0 {
		return Settled{}, fmt.Errorf("%w: settle %v", scriptreply.ErrReply, v)
	}
	return Settled{Back: v[0], Lost: v[1], Debt: v[2]}, nil
}
