// Package queue is the Redis side of a distributed token bucket: the keys
// of one bucket and the Lua scripts that change them, each one atomic step.
//
//   - Enqueue: a caller arrives. With nobody queued and a token due within
//     the lookahead, it gets that token at once (the fast path, one round
//     trip); otherwise its ID is pushed on the tail of the queue.
//   - Step: the scheduler, fenced by its lock token, pops IDs from the head
//     (FIFO by arrival at Redis), writes each one's slot, saves the bucket
//     and, when the queue is empty, deletes the lock in the same script.
//   - Poll: a queued caller collects its slot, consuming it.
//   - Cancel: a caller that gives up leaves the queue.
//
// All times are taken from Redis TIME inside the scripts; replies carry
// durations relative to it, so client clocks never matter. The state of every
// policy lives in Redis, never in a process, so the rate holds even if two
// schedulers run at once: the lock only saves work.
//
// A Queue is safe for concurrent use.
package queue
