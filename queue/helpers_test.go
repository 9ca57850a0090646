package queue

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
)

var ctx = context.Background()

// newQ is New of the bucket name under prefix, with the policies given
// apart, as the tests were written.
func newQ(rdb queueio.Client, prefix, name string, ps []protocol.Policy, opt queueio.Options) *Queue {
	opt.Keys, opt.Policies = queueio.NewKeys(prefix, name), ps
	return New(rdb, opt)
}

// newQueue is the Queue of a test's own bucket with default options.
func newQueue(t *testing.T, rdb *redis.Client, p protocol.Policy, opt queueio.Options) *Queue {
	t.Helper()
	if opt.LockTTL == 0 {
		opt.LockTTL = time.Second
	}
	if opt.Grace == 0 {
		opt.Grace = 10 * time.Second
	}
	if opt.Lookahead == 0 {
		opt.Lookahead = 20 * time.Millisecond
	}
	if opt.MaxLateness == 0 {
		opt.MaxLateness = time.Second
	}
	return newQ(rdb, "sluice", t.Name(), []protocol.Policy{p}, opt)
}

// The outcomes of an arrival, as enqueue.lua numbers them.
const kQueued = kindQueued

// kindOf is what an arrival's fields say happened.
func kindOf(a queueio.Arrival) int {
	switch {
	case a.Err == queueio.ErrQueueFull:
		return kindQueueFull
	case a.Err == queueio.ErrWaitTooLong:
		return kindWaitTooLong
	case a.Entry != "":
		return kindQueued
	case a.Delay == 0:
		return kindGranted
	}
	return kindAssigned
}

// scriptOnly hides the *redis.Client behind the Client interface.
type scriptOnly struct{ queueio.Client }
