package queue

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/scriptreply"
)

//go:embed lua/feedback.lua
var feedbackLua string

var feedbackScript = protocol.Script(feedbackLua, protocol.TokensLua, protocol.StateLua, protocol.EntryLua)

// Sync brings one policy's level down to what the upstream says remains.
type Sync struct {
	Policy    int           // index in the policies q runs under
	Remaining int64         // tokens left upstream; the level is lowered to it, never raised
	Reset     time.Duration // when lowered, the policy's refills resume no sooner than this from now; 0: at once
}

// FeedbackResult is what Feedback did.
type FeedbackResult struct {
	Owed    int // slots already handed out (within the lookahead) that the hold did not stop
	Lowered int // syncs that lowered a level
}

// Feedback applies, for every process at once and in one script, a hold
// (no slot of the policies held, nil meaning all, comes before now + hold
// on the Redis clock; 0 holds nothing) and syncs (feedback.lua). Policy
// indexes are those of the policies q runs under (Policies); id names
// them: when the configuration in force is another, Feedback changes
// nothing and returns a *ConfigError.
func (q *Queue) Feedback(ctx context.Context, id string, hold time.Duration, held []int, syncs []Sync) (FeedbackResult, error) {
	reply, err := q.run(ctx, feedbackScript, q.keys.retime(), func(c *conf) ([]any, error) {
		if c.id != id {
			return nil, &ConfigError{mine: id}
		}
		hs := make([]string, len(held))
		for i, h := range held {
			hs[i] = strconv.Itoa(h + 1)
		}
		args := []any{us(q.opt.Grace), us(hold), strings.Join(hs, ",")}
		args = append(args, c.args...)
		args = append(args, len(syncs))
		for _, s := range syncs {
			args = append(args, s.Policy+1, s.Remaining, us(s.Reset))
		}
		return args, nil
	})
	v, err := scriptreply.Ints(reply, err)
	if err != nil {
		return FeedbackResult{}, err
	}
	if len(v) != 2 || v[0] < 0 || v[1] < 0 {
		return FeedbackResult{}, fmt.Errorf("%w: feedback %v", scriptreply.ErrReply, v)
	}
	return FeedbackResult{Owed: int(v[0]), Lowered: int(v[1])}, nil
}
