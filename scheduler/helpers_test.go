package scheduler_test

import (
	"context"
	"strings"

	"github.com/sluicehq/sluice/queue"
)

// newQ is queue.New with the policies given apart, as the tests were
// written.
func newQ(rdb queue.Client, prefix, name string, ps []queue.Policy, opt queue.Options) *queue.Queue {
	opt.Policies = ps
	return queue.New(rdb, prefix, name, opt)
}

// stateKey is the key of q's state: the queue's keys share their start
// (queue's TestKeys pins the layout).
func stateKey(q *queue.Queue) string {
	return strings.TrimSuffix(q.Keys().Queue, "queue") + "state"
}

// enqueueOne makes one caller arrive.
func enqueueOne(q *queue.Queue, id string) (queue.Arrival, error) {
	rs, err := q.Enqueue(context.Background(), []string{id}, nil, nil)
	if err != nil {
		return queue.Arrival{}, err
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
func kindOf(a queue.Arrival) int {
	switch {
	case a.Err == queue.ErrQueueFull:
		return kQueueFull
	case a.Err == queue.ErrWaitTooLong:
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
func pollKindOf(p queue.PollReply) int {
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
	return q.Keys().Slot + id
}
