package queue

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/scriptreply"
)

// Retimed is what Retime did.
type Retimed struct {
	Delay    time.Duration // until the new slot, from when Redis read its clock
	Slot     int64         // the new slot, µs on the Redis clock (for analysis only)
	Refunded bool          // the missed slot's tokens were still there: the caller starts now (Delay 0) with them
	// Claimed: the caller was given another caller's slot, which that
	// caller had not come for (Delay negative: it starts at once), and
	// that caller the next slot instead (internal/protocol/claim.lua).
	Claimed bool
	Room    string // the new slot's room, for a caller late again
	// Entry (set when Retime wrote the next slot rather than told it):
	// the caller polls for its slot (Poll) as a queued caller does, a
	// lead before Delay from Now.
	Entry string
	Now   int64 // the Redis clock (µs) when the script read it
}

// Retime serves a caller that came too late to use its slot: at once, with
// the missed slot's tokens, when they stayed unused in the bucket (exact:
// lua/refund.lua), or else at the next slot the bucket has, ahead of the
// callers still queued (lua/retime.lua). slot (µs, Redis clock) and room
// are what the poll that found the slot said of it (PollReply.Slot and
// Room, or Retimed's; a room "" for none: the tokens then stay spent);
// costs are the caller's, one per policy (nil: each policy's Call). With
// an id (fresh, as Enqueue's) and no costs of its own, a caller whose
// next slot is further off than the lead is not told it: the slot is
// written as a step writes one, and the caller polls for it as
// Retimed.Entry, so that a running caller can claim it should the
// caller's process stop again. One round trip.
func (q *Queue) Retime(ctx context.Context, slot int64, room string, costs []int64, id string) (Retimed, error) {
	again := ""
	if id != "" && costs == nil {
		again = protocol.MakeEntry(id, 0, "")
	}
	reply, err := q.runFor(ctx, retimeScript, q.keys.retime(), true, func(c *conf) ([]any, error) {
		if costs != nil && len(costs) != len(c.policies) {
			return nil, &ConfigError{mine: c.id}
		}
		args := make([]any, 0, 5+len(c.args))
		value := ""
		if room != "" {
			value = protocol.SlotValue(slot, room)
		}
		lo, hi := protocol.ClaimWindow(q.opt.MaxLateness)
		args = append(args, value, protocol.Costs(costs), us(q.opt.Grace), lo, hi, again, us(q.opt.Lead))
		return append(args, c.args...), nil
	})
	if err != nil {
		return Retimed{}, err
	}
	v, ok := reply.([]any)
	if !ok || len(v) != 4 {
		return Retimed{}, fmt.Errorf("%w: retime %v", scriptreply.ErrReply, reply)
	}
	delay, ok1 := v[0].(int64)
	moved, ok2 := v[1].(int64)
	r, ok3 := v[2].(string)
	now, ok4 := v[3].(int64)
	if !ok1 || !ok2 || !ok3 || !ok4 {
		return Retimed{}, fmt.Errorf("%w: retime %v", scriptreply.ErrReply, reply)
	}
	if moved < 0 || moved > 3 {
		return Retimed{}, fmt.Errorf("%w: retime %v", scriptreply.ErrReply, reply)
	}
	out := Retimed{Delay: dur(delay, time.Microsecond), Refunded: moved == 1, Claimed: moved == 2, Room: r, Now: now}
	out.Slot = now + delay
	if moved == 3 {
		out.Entry = again
	}
	return out, nil
}
