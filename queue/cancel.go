// The cancel script's owner: callers that give up their places
// (lua/cancel.lua).

package queue

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/scriptreply"
)

// Leaver is a caller that gives up: its Entry (or, if it never learned
// it, its bare ID; "" for a caller given its slot at arrival) and, when it
// read its slot, that Slot (µs, Redis clock) and its Room
// (queueio.PollReply, queueio.Retimed), with its Costs, one per policy (nil: those its entry names, or
// each policy's Call).
type Leaver struct {
	Entry, Room string
	Slot        int64
	Costs       []int64
}

// Cancel takes callers that gave up out of the bucket, in one round trip.
// A caller still queued leaves without spending a token. One whose slot
// was written passes it on when it is still at least a Lead ahead: the
// next caller in line takes it as it is, if it needs no more tokens of
// any policy, and is told on the wake channel; the grants keep the
// instants the steps gave them. Otherwise the slot's tokens go back to
// the bucket when that is exact, as a late caller's do (Retime), and stay
// spent when it is not (never an excess).
func (q *Queue) Cancel(ctx context.Context, leavers ...Leaver) error {
	_, err := q.cancel(ctx, leavers)
	return err
}

// cancelResult is what cancel.lua found of one caller.
type cancelResult int

const (
	removed  cancelResult = 0 // left the queue before it had a slot: no token spent
	forfeit  cancelResult = 1 // it had a slot: its tokens stay spent
	notFound cancelResult = 2 // unknown ID
	passedOn cancelResult = 3 // it had a slot, which the next caller took
	gaveBack cancelResult = 4 // it had a slot, whose tokens went back
)

// cancel runs under the configuration in force: callers that queued
// before a live change leave under the new one.
func (q *Queue) cancel(ctx context.Context, leavers []Leaver) ([]cancelResult, error) {
	keys := []string{q.keys.Queue, q.keys.Slot, q.keys.State, q.keys.Config, q.keys.Refunds, q.keys.LaneQueue, q.keys.Classes, q.keys.Class}
	reply, err := q.runInForce(ctx, cancelScript, keys, func(c *conf) ([]any, error) {
		args := make([]any, 0, 3+len(c.args)+3*len(leavers))
		args = append(args, us(q.opt.Grace), us(q.opt.Lead), q.keys.Wake)
		args = append(args, c.args...)
		for _, l := range leavers {
			value := ""
			if l.Room != "" && (l.Costs == nil || len(l.Costs) == len(c.policies)) {
				value = protocol.SlotValue(l.Slot, l.Room)
			}
			args = append(args, l.Entry, value, protocol.Costs(l.Costs))
		}
		return args, nil
	})
	return parseCancel(len(leavers), reply, err)
}

// parseCancel checks a cancel reply for n callers.
func parseCancel(n int, reply any, err error) ([]cancelResult, error) {
	v, err := scriptreply.Ints(reply, err)
	if err != nil {
		return nil, err
	}
	if len(v) != n {
		return nil, fmt.Errorf("%w: cancel of %d callers gave %d values", scriptreply.ErrReply, n, len(v))
	}
	out := make([]cancelResult, n)
	for i, x := range v {
		if x < 0 || x > 4 {
			return nil, fmt.Errorf("%w: cancel %v", scriptreply.ErrReply, v)
		}
		out[i] = cancelResult(x)
	}
	return out, nil
}
