// Calls to Redis made for a caller: their bounds, the classification of
// their errors, and the leaving of a caller that gives up.

package bucket

import (
	"context"
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/sluicehq/sluice/internal/rediscall"
	"github.com/sluicehq/sluice/queue"
)

// answerWithin bounds each call to Redis made for a caller whose ctx has
// no earlier deadline: rediscall.AnswerWithin, plus 4 × ReplicaTimeout
// when the call waits for replicas (ReplicaAcks: a poll may make several
// round trips, each with its WAIT, and a script sent again after NOSCRIPT
// waits again).
func (b *Bucket) answerWithin() time.Duration {
	if b.cfg.ReplicaAcks > 0 {
		return rediscall.AnswerWithin + 4*b.cfg.ReplicaTimeout
	}
	return b.fb.answerWithin()
}

// busy reports that a call made on cctx (rediscall.CallCtx(ctx), which
// added the limit within; cancelled since) ran out of that limit (err, its
// error, a timeout), not of ctx, while Redis still answers: a call of
// this process's made since got its reply, or a PING does. Redis is then
// slow (a burst of thousands of arrivals), or this process starved, not
// away, and the call may be made again.
func (b *Bucket) busy(ctx, cctx context.Context, within time.Duration, err error) bool {
	// go-redis sets the socket's deadline from cctx's: its read may time
	// out a moment before cctx reports it.
	var ne net.Error
	timedOut := errors.Is(cctx.Err(), context.DeadlineExceeded) || errors.As(err, &ne) && ne.Timeout()
	if within <= 0 || ctx.Err() != nil || !timedOut {
		return false
	}
	return b.fb.answers(ctx, b.now().Add(-within)) // since the call began
}

// redisErr reports sluice.ErrClosed after Close, and otherwise an error that
// matches both the caller's ctx error, when its ctx (or deadline) is what
// cut the call short, and Redis's.
func (b *Bucket) redisErr(ctx context.Context, err error) error {
	return b.callErr(ctx, err, 0)
}

// callErr is redisErr for a call made on rediscall.CallCtx, whose
// limit added is within: when that limit ended the call, the error says
// Redis gave no answer within it (and why, when a dial shows it), and
// does not match the caller's ctx errors.
func (b *Bucket) callErr(ctx context.Context, err error, within time.Duration) error {
	select {
	case <-b.bg.Done(): // Close cut the call short
		return errClosed
	default:
	}
	if errors.Is(err, queue.ErrNotReplicated) {
		return fmt.Errorf("%w: %v", ErrNotReplicated, err)
	}
	return rediscall.RedisError(ctx, "bucket", b.cfg.Name, b.rdb, err, within)
}

// cancel takes a caller that gives up out of the queue, by its entry or,
// if it never learned it, by its ID, in the background: the caller returns
// at once even if Redis hangs.
func (b *Bucket) cancel(entry string) { b.leave(queue.Leaver{Entry: entry}) }

// leave is cancel for a caller that read its slot: its tokens pass on.
// The queue's back may then come earlier than this process last learned.
func (b *Bucket) leave(l queue.Leaver) {
	b.back.forget()
	b.comings.leave(l)
}
