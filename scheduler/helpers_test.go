package scheduler_test

import (
	"context"
	"strings"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/queue"
)

// newQ is queue.New of the bucket name under prefix, with the policies
// given apart, as the tests were written.
func newQ(rdb queueio.Client, prefix, name string, ps []protocol.Policy, opt queueio.Options) *queue.Queue {
	opt.Keys, opt.Policies = queueio.NewKeys(prefix, name), ps
	return queue.New(rdb, opt)
}

// keysOf is the keys of q's bucket.
func keysOf(q *queue.Queue) queueio.Keys { return q.Options().Keys }

// stateKey is the key of q's state.
func stateKey(q *queue.Queue) string { return keysOf(q).State }

// enqueueOne makes one caller arrive.
func enqueueOne(q *queue.Queue, id string) (queueio.Arrival, error) {
	rs, err := q.Enqueue(context.Background(), []string{id}, nil, nil)
	if err != nil {
		return queueio.Arrival{}, err
	}
	return rs[0], nil
}

// The outcomes of an arrival, as enqueue.lua numbers them.
const (
	kGranted = iota
	kAssigned
	kQueued
	kQueueFull
	kWaitTooLong
)

// kindOf is what an arrival's fields say happened.
func kindOf(a queueio.Arrival) int {
	switch {
	case a.Err == queueio.ErrQueueFull:
		return kQueueFull
	case a.Err == queueio.ErrWaitTooLong:
		return kWaitTooLong
	case a.Entry != "":
		return kQueued
	case a.Delay == 0:
		return kGranted
	}
	return kAssigned
}

// The outcomes of a poll, as poll.lua numbers them.
const (
	pSlot = iota + 1
	pWaiting
	pStale
	pLost
)

// pollKindOf is what a poll's fields say it found.
func pollKindOf(p queueio.PollReply) int {
	switch {
	case p.Found:
		return pSlot
	case p.Stale:
		return pStale
	case p.Lost:
		return pLost
	}
	return pWaiting
}

// slotKey is the key of the slot of the caller known by entry.
func slotKey(q *queue.Queue, entry string) string {
	id, _, _ := strings.Cut(entry, "|")
	return keysOf(q).Slot + id
}
