package queue

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/internal/scriptreply"
)

// Retime serves a caller that came too late to use its slot: at once, with
// the missed slot's tokens, when they stayed unused in the bucket (exact:
// lua/refund.lua), or else at the next slot the bucket has, ahead of the
// callers still queued (lua/retime.lua). slot (µs, Redis clock) and room
// are what the poll that found the slot said of it (queueio.PollReply's
// Slot and Room, or queueio.Retimed's; a room "" for none: the tokens then
// stay spent); costs are the caller's, one per policy (nil: each policy's
// Call). With an id (fresh, as Enqueue's) and no costs of its own, a
// caller whose next slot is further off than the lead is not told it: the
// slot is written as a step writes one, and the caller polls for it as
// queueio.Retimed.Entry, so that a running caller can claim it should the
// caller's process stop again. quiet: the caller reads its replies
// promptly (its round trips are short), so that a grant moved to now
// starts within MaxLateness of it; the grant may then move whenever the
// bucket counted no refill since the slot (lua/refund.lua's no_refill),
// not only by the peaks. One round trip.
func (q *Queue) Retime(ctx context.Context, slot int64, room string, costs []int64, id string, quiet bool) (queueio.Retimed, error) {
	again := ""
	if id != "" && costs == nil {
		again = protocol.MakeEntry(id, 0, "")
	}
	reply, err := q.runFor(ctx, retimeScript, retimeKeys(q.keys), true, func(c *conf) ([]any, error) {
		if costs != nil && len(costs) != len(c.policies) {
			return nil, &queueio.ConfigError{Mine: c.id}
		}
		args := make([]any, 0, 8+len(c.args))
		value := ""
		if room != "" {
			value = protocol.SlotValue(slot, room)
		}
		lo, hi := protocol.ClaimWindow(q.opt.MaxLateness)
		moves := "0"
		if quiet {
			moves = "1"
		}
		args = append(args, value, protocol.Costs(costs), us(q.opt.Grace), lo, hi, again, us(q.opt.Lead), moves)
		return append(args, c.args...), nil
	})
	if err != nil {
		return queueio.Retimed{}, err
	}
	v, ok := reply.([]any)
	if !ok || len(v) != 4 {
		return queueio.Retimed{}, fmt.Errorf("%w: retime %v", scriptreply.ErrReply, reply)
	}
	delay, ok1 := v[0].(int64)
	moved, ok2 := v[1].(int64)
	r, ok3 := v[2].(string)
	now, ok4 := v[3].(int64)
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return queueio.Retimed{}, fmt.Errorf("%w: retime %v", scriptreply.ErrReply, reply)
	}
	if moved < 0 || moved > 3 {
		return queueio.Retimed{}, fmt.Errorf("%w: retime %v", scriptreply.ErrReply, reply)
	}
	out := queueio.Retimed{Delay: dur(delay, time.Microsecond), Refunded: moved == 1, Claimed: moved == 2, Room: r, Now: now}
	out.Slot = now + delay
	if moved == 3 {
		out.Entry = again
	}
	return out, nil
}
