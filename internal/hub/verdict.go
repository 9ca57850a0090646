package hub

import (
	"context"
	"log/slog"
	"time"
)

// AwaitVerdict waits for the probe's verdict on a call made at since that
// ran out of its own bound: true once the probe had an answer after
// since (Redis is slow, not away); false once Redis is marked away, ctx
// ends, or giveUp passes (zero: never; the probe gives no verdict once
// nothing watches). A handle's fallback asks it (bucket's local share,
// the semaphore's).
func (h *Hub) AwaitVerdict(ctx context.Context, since, giveUp time.Time) bool {
	t := time.NewTicker(ProbeEvery)
	defer t.Stop()
	for {
		answered, away, changed := h.Answered()
		switch {
		case away:
			return false
		case answered.After(since):
			return true
		case !giveUp.IsZero() && time.Now().After(giveUp):
			return false
		}
		select {
		case <-changed:
		case <-t.C:
		case <-ctx.Done():
			return false
		}
	}
}

// Say logs msg through logger (a handle's Config.Logger; nil: nothing) at
// level for the first handle on the Hub to say the current change of
// reachability (FirstToSay), at Debug for the others.
func (h *Hub) Say(logger *slog.Logger, level slog.Level, msg string, args ...any) {
	if logger == nil {
		return
	}
	if !h.FirstToSay(logger) {
		level = slog.LevelDebug
	}
	logger.Log(context.Background(), level, msg, args...)
}
