package bucket

import (
	"context"
	"errors"
	"time"

	"github.com/sluicehq/sluice/internal/rediscall"
)

// fallback is what a caller's path asks of the bucket's fallback while
// Redis is unreachable (Config.Fallback): noFallback, where a caller
// fails with Redis's error, or the local share (localShare). The path
// asks it, never whether there is one.
type fallback interface {
	// begin counts a caller in; the returned func counts it out.
	begin() (end func())
	// serving says whether a caller goes to the fallback now.
	serving() bool
	// admit serves a caller there (queued in Redis as entry, or "");
	// errBack: the bucket is back on Redis, the caller enters there.
	admit(ctx context.Context, entry string, costs []int64, rep *Report) error
	// away says whether err, a failed call's, sends the caller to the
	// fallback.
	away(ctx context.Context, err error) bool
	// answers says, for a call made at since that ran out of its bound,
	// whether Redis still answers (slow, not away: make it again).
	answers(ctx context.Context, since time.Time) bool
	// answerWithin bounds each call made for a caller.
	answerWithin() time.Duration
	// queue registers a caller queued in Redis: switched closes when it
	// is to go to the fallback; forget when it leaves the queue.
	queue(entry string, ticket int64, costs []int64) (switched <-chan struct{}, forget func())
	// reach closes when Redis's reachability changes (nil: never).
	reach() <-chan struct{}
	// goLocal switches to the fallback, and says whether it serves now.
	goLocal() bool
	// state is this process's side, for Stats and Inspect.
	state() (local bool, since time.Time, n int)
}

// noFallback is the fallback of a Bucket without one: callers fail with
// Redis's error.
type noFallback struct{ b *Bucket }

func (noFallback) begin() func()                                          { return func() {} }
func (noFallback) serving() bool                                          { return false }
func (noFallback) admit(context.Context, string, []int64, *Report) error  { return errBack }
func (noFallback) away(context.Context, error) bool                       { return false }
func (noFallback) answerWithin() time.Duration                            { return rediscall.AnswerWithin }
func (noFallback) queue(string, int64, []int64) (<-chan struct{}, func()) { return nil, func() {} }
func (noFallback) reach() <-chan struct{}                                 { return nil }
func (noFallback) goLocal() bool                                          { return false }
func (noFallback) state() (bool, time.Time, int)                          { return false, time.Time{}, 0 }

// answers: Redis answered a call of this process's that left after this
// one did: it runs, and this call met a queue (thousands of callers on
// one pool) or a process too starved to read its reply in time, not a
// frozen Redis; no PING can say more, and a starved process's own PING
// may run out as its call did. Otherwise one PING decides.
func (n noFallback) answers(ctx context.Context, since time.Time) bool {
	return n.b.hub.RepliedSince(since) || n.b.hub.Answers(ctx, rediscall.AnswerWithin)
}

// errLocal: a call found Redis away, and the caller is to be admitted
// from the local share.
var errLocal = errors.New("bucket: served by the local share")

// errBack: the bucket is back on Redis; the caller enters there.
var errBack = errors.New("bucket: back on Redis")

// errReach: a queued caller's sleep ended because the bucket switched to
// its share or Redis's reachability changed.
var errReach = errors.New("bucket: reachability changed")

// goneLocal is the error of a call that found Redis away once the bucket
// switched to its share: the caller (queued in Redis under entry, if not
// "") is to be admitted there.
type goneLocal struct{ entry string }

func (goneLocal) Error() string { return errLocal.Error() }
func (goneLocal) Unwrap() error { return errLocal }
