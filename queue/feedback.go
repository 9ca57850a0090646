package queue

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/internal/scriptreply"
)

//go:embed lua/feedback.lua
var feedbackLua string

var feedbackScript = protocol.Script(feedbackLua, protocol.TokensLua, protocol.StateLua, protocol.EntryLua)

// Feedback applies, for every process at once and in one script, a hold
// (no slot of the policies held, nil meaning all, comes before now + hold
// on the Redis clock; 0 holds nothing) and syncs (feedback.lua). Policy
// indexes are those of the policies q runs under (Options); id names
// them: when the configuration in force is another, Feedback changes
// nothing and returns a *queueio.ConfigError.
func (q *Queue) Feedback(ctx context.Context, id string, hold time.Duration, held []int, syncs []queueio.Sync) (queueio.FeedbackResult, error) {
	reply, err := q.run(ctx, feedbackScript, retimeKeys(q.keys), func(c *conf) ([]any, error) {
		if c.id != id {
			return nil, &queueio.ConfigError{Mine: id}
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
		return queueio.FeedbackResult{}, err
	}
	if len(v) != 2 || v[0] < 0 || v[1] < 0 {
		return queueio.FeedbackResult{}, fmt.Errorf("%w: feedback %v", scriptreply.ErrReply, v)
	}
	return queueio.FeedbackResult{Owed: int(v[0]), Lowered: int(v[1])}, nil
}
