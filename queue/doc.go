// Package queue is the queue of a distributed token bucket: its Redis keys,
// the callers' arrivals (enqueue.lua, or the push lane for callers arriving
// behind waiting ones), their polls for a slot and their cancels, each one
// atomic step on the Redis clock. It is one of the bucket's building blocks,
// with package scheduler (which pops the queue and writes the slots), and
// exports only the calls those two packages make, with Cancel's Leaver
// and ErrNotReplicated. Their options and the bucket's keys, their replies
// and the other errors they report live in internal/queueio, with the
// plain reads of the keys that run no script (the configuration in force,
// a snapshot): only this module can build a Queue, and users need only
// package bucket.
//
//   - Enqueue: callers arrive. With nobody queued and a token due within
//     the lookahead, a caller gets that token at once (the fast path, one
//     round trip); otherwise its entry is pushed on the tail of the queue.
//   - Poll: a queued caller collects the slot the scheduler wrote for it,
//     consuming it.
//   - Cancel: callers that give up leave the queue.
//
// All times are taken from Redis TIME inside the scripts; replies carry
// durations relative to it, so client clocks never matter. The state of every
// policy lives in Redis, never in a process, so the rate holds even if two
// schedulers run at once. The formats the scripts share with Go (a queue
// entry, the state string, a wake message) and the token arithmetic live in
// internal/protocol.
//
// A Queue is safe for concurrent use.
package queue
