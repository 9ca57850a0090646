package queue

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

var ctx = context.Background()

// newQ is New with the policies given apart, as the tests were written.
func newQ(rdb Client, prefix, name string, ps []Policy, opt Options) *Queue {
	opt.Policies = ps
	return New(rdb, prefix, name, opt)
}

// newQueue is the Queue of a test's own bucket with default options.
func newQueue(t *testing.T, rdb *redis.Client, p Policy, opt Options) *Queue {
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
	return newQ(rdb, "sluice", t.Name(), []Policy{p}, opt)
}

// The outcomes of an arrival, as enqueue.lua numbers them.
const kQueued = kindQueued

// kindOf is what an arrival's fields say happened.
func kindOf(a Arrival) int {
	switch {
	case a.Err == ErrQueueFull:
		return kindQueueFull
	case a.Err == ErrWaitTooLong:
		return kindWaitTooLong
	case a.Entry != "":
		return kindQueued
	case a.Delay == 0:
		return kindGranted
	}
	return kindAssigned
}

// scriptOnly hides the *redis.Client behind the Client interface.
type scriptOnly struct{ Client }
