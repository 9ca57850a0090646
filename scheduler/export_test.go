package scheduler

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/queue"
)

// Statuses of a step, for tests.
const (
	Fenced   = int(fenced)
	Released = int(released)
	Running  = int(running)
)

// StepResult is a step's reply, for tests.
type StepResult struct {
	Status    int
	Next      time.Duration
	Waiting   int
	Scheduled int
}

// Step runs one step of q's scheduler as the holder of token.
func Step(ctx context.Context, rdb redis.Scripter, q *queue.Queue, token string) (StepResult, error) {
	r, err := step(ctx, rdb, q, token)
	return StepResult{Status: int(r.status), Next: r.next, Waiting: r.waiting, Scheduled: r.scheduled}, err
}

// IsRunning exposes whether s is due to step or stepping.
func IsRunning(s *Scheduler) bool { return s.job.Active() }
