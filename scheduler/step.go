package scheduler

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/internal/scriptreply"
	"github.com/sluicehq/sluice/queue"
)

//go:embed lua/step.lua
var stepLua string

var stepScript = protocol.Script(stepLua, protocol.TokensLua, protocol.StateLua, protocol.EntryLua, protocol.LanesLua, protocol.WakeLua, protocol.ScheduleLua)

// stepStatus is what a step decided.
type stepStatus int

const (
	fenced   stepStatus = -1 // the lock is not held by this token: stop
	released stepStatus = 0  // the queue is empty and the lock was released
	running  stepStatus = 1  // callers still wait: step again after next
)

// stepReply is what a step did.
type stepReply struct {
	status    stepStatus
	next      time.Duration // running: when the next caller enters the lookahead
	waiting   int           // callers still queued
	scheduled int           // callers given a slot by this step
}

// step runs one step of q's scheduler as the holder of the lock token.
func step(ctx context.Context, rdb redis.Scripter, q *queue.Queue, token string) (stepReply, error) {
	o := q.Options()
	return runStep(ctx, q, o, token, o.LockTTL.Milliseconds(), o.Lookahead)
}

// lastStep runs one step and releases the lock in the same script, even
// if callers still wait: the hand-over.
func lastStep(ctx context.Context, q *queue.Queue, o queueio.Options, token string) (stepReply, error) {
	return runStep(ctx, q, o, token, 0, o.Lookahead)
}

// runStep runs one step of q, whose options are o, that gives slots up to
// lookahead ahead.
func runStep(ctx context.Context, q *queue.Queue, o queueio.Options, token string, lockTTLms int64, lookahead time.Duration) (stepReply, error) {
	k := o.Keys
	// The scheduler serves every process's callers: q.Run follows the
	// configuration in force after a live change, whoever set it.
	return parseStep(q.Run(ctx, stepScript, k.All(), func(policies []any) []any {
		args := []any{token, lockTTLms, scriptreply.Micros(lookahead), o.MaxBatch, scriptreply.Micros(o.Grace), scriptreply.Micros(o.Lead), k.Wake}
		return append(args, policies...)
	}))
}

// parseStep checks a step reply.
func parseStep(reply any, err error) (stepReply, error) {
	v, err := scriptreply.Ints(reply, err)
	if err != nil {
		return stepReply{}, err
	}
	if len(v) != 4 || v[0] < -1 || v[0] > 1 {
		return stepReply{}, fmt.Errorf("%w: step %v", scriptreply.ErrReply, v)
	}
	return stepReply{
		status:    stepStatus(v[0]),
		next:      scriptreply.Dur(v[1], time.Microsecond),
		waiting:   int(v[2]),
		scheduled: int(v[3]),
	}, nil
}
