// Package queueio is what goes into a queue.Queue and what comes out of
// it: its options and the bucket's keys, the results of its calls, the
// errors they report, and the plain reads of a bucket's keys that run no
// script (the configuration in force, a snapshot). They live here, not in
// package queue, so that queue exports only its calls while bucket,
// scheduler, cmd/bench and the tests share one definition of each.
//
// The scripts' replies are parsed in package queue, beside the Lua that
// writes them (the one owner of each script); the formats they share with
// Lua are internal/protocol's.
package queueio

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/protocol"
)

// Options describe a Queue. Durations are used in whole microseconds.
type Options struct {
	Keys        Keys              // the bucket's keys (NewKeys)
	Policies    []protocol.Policy // the bucket's limits; a caller takes its costs (or each one's Call) from all of them
	Lookahead   time.Duration     // slots within this are given at once; the scheduler schedules this far ahead
	LockTTL     time.Duration     // the scheduler lock's TTL, renewed by every step
	Grace       time.Duration     // added to every key's TTL; uncollected slots are dropped after it
	MaxLateness time.Duration     // a slot older than this when polled is stale; < 0: never (bucket.Config.MaxLateness)
	Lead        time.Duration     // callers poll this long before their estimated slot
	MaxQueue    int               // refuse new callers when this many wait; 0: unbounded
	MaxWait     time.Duration     // refuse new callers whose estimated wait exceeds it; 0: unbounded
	MaxBatch    int               // most callers one scheduler step schedules; 0: 1000
	// Replicas, when above 0, is how many replicas must acknowledge the
	// writes of a grant (WAIT, within ReplicaTimeout) before a caller
	// learns it: queue/replicas.go. It needs one master (*redis.Client).
	Replicas       int
	ReplicaTimeout time.Duration
	// Logger, when set, is told what an operator must know (the push
	// lane turned off; the scheduler fenced); nil logs nothing.
	Logger *slog.Logger
}

// Client is what a Queue needs of Redis: its scripts, and reading and
// storing the configuration in force. Every go-redis client has it.
type Client interface {
	redis.Scripter
	Get(ctx context.Context, key string) *redis.StringCmd
	SetNX(ctx context.Context, key string, value any, expiration time.Duration) *redis.BoolCmd
	Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error)
}

// Refusals of Enqueue, reported per caller in Arrival.Err. A refused caller
// consumed nothing.
var (
	ErrQueueFull   = errors.New("queue: queue full")
	ErrWaitTooLong = errors.New("queue: wait too long")
)

// ConfigError reports that a script refused to run because the bucket's
// configuration in force (InForce, its id) is not the one the Queue ran
// it under (Mine): nothing was changed. InForce is "" when the call was
// made for a configuration the Queue no longer runs under (costs per
// policy of the policies Follow replaced).
type ConfigError struct {
	InForce string
	Mine    string // the id of the configuration the call was made for
}

func (e *ConfigError) Error() string {
	if e.InForce == "" {
		return "queue: the call was made for configuration " + e.Mine + ", which this queue no longer runs under"
	}
	return "queue: the bucket's configuration in force is " + e.InForce + ", not this queue's " + e.Mine
}
