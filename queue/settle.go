package queue

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/internal/scriptreply"
)

//go:embed lua/settle.lua
var settleLua string

var settleScript = protocol.Script(settleLua, protocol.TokensLua, protocol.StateLua, protocol.EntryLua)

// Settle corrects every policy at once by diffs, the true cost of a call
// less the estimate it was granted with, one per policy in the order of
// the configuration id names (lua/settle.lua): a negative difference goes
// back to the bucket (up to each policy's capacity), a positive one is
// taken as a debt the callers after it wait out. slot is the grant's (µs
// on the Redis clock, 0 if unknown), which a rolling window's give-back
// needs. When the configuration in force is another, Settle changes
// nothing and returns a *queueio.ConfigError. One round trip.
//
// The script also replies with the tokens given back, lost at capacity
// and taken as a debt; Settle only checks that reply's shape.
func (q *Queue) Settle(ctx context.Context, id string, slot int64, diffs []int64) error {
	reply, err := q.run(ctx, settleScript, retimeKeys(q.keys), func(c *conf) ([]any, error) {
		if c.id != id || len(diffs) != len(c.policies) {
			return nil, &queueio.ConfigError{Mine: id}
		}
		args := []any{us(q.opt.Grace), protocol.Costs(diffs), max(slot, 0)}
		return append(args, c.args...), nil
	})
	v, err := scriptreply.Ints(reply, err)
	if err != nil {
		return err
	}
	if len(v) != 3 || v[0] < 0 || v[1] < 0 || v[2] < 0 {
		return fmt.Errorf("%w: settle %v", scriptreply.ErrReply, v)
	}
	return nil
}
