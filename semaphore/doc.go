// Package semaphore is a distributed semaphore on Redis: at most Capacity
// permits are held at once across every process that uses the same Name,
// and waiters are served first come, first served by their arrival at
// Redis.
//
// Lanes decide who goes first when waiters of several kinds share one
// semaphore: WithLane(ctx, "tenant-42") (the same ctx key as
// bucket.WithLane) puts Acquire, AcquireN and Do in a lane, and
// Config.Lanes gives the lanes that differ a Weight and a Priority
// (sluice.Lane). Within a lane waiters are served in their arrival order;
// among the lanes of one priority with waiters, each gets at least its
// weight's share of the permits granted, counted in permits (a waiter of
// weight 3 counts 3), and a lane with nobody waiting lends its share at
// once; a higher priority is served first, but each priority below one
// with waiters keeps a floor of 1 permit in 16. The choice is made in the
// script that grants, by the same rules as a bucket's (docs/lanes.md).
// Waiters that name no lane are the default lane, of weight 1 and
// priority 0: a semaphore whose callers never name a lane runs as it did
// without lanes. The local share (Config.Fallback) serves its waiters in
// their arrival order, lanes aside.
//
// Permits may be weighted: AcquireN takes one worth n of Capacity, and the
// weights held never sum above it. Waiters keep their arrival order
// whatever their weights: a heavy waiter at the head holds back lighter
// ones behind it until its weight is free, so it is never starved. A
// weight above Capacity is refused at once with sluice.ErrCostExceedsCapacity.
//
// Every permit is a lease on the Redis clock, renewed in the background
// while held; a holder whose process dies frees its permit within one
// LeaseTTL, and a holder that loses its lease (it was frozen, or Redis
// restarted) learns it from Permit.Lost. Releasing twice, or after the
// lease ended, never frees someone else's permit. Release returns at once:
// the release reaches Redis with the process's next exchange (an
// acquire-work-release loop pays one round trip per permit), and Close
// sends every release still pending. Waiters are woken by pub/sub, with a
// bounded fallback check; success is always a script's reply. One script
// (sync.lua) carries everything a process sends in one round trip, one
// exchange at a time: releases, renewals, arrivals, cancellations.
//
// The capacity in force is stored in Redis with the semaphore's state: the
// first process to arrive stores its own, a process configured otherwise
// gets sluice.ErrConfigMismatch (unless Config.Adopt), and SetCapacity changes it
// for every process at once.
//
// Stats reads this process's figures without I/O (waiting, weight held,
// results, leases lost) and Inspect the semaphore's across every process
// in one round trip; Config.Observer is told of every Acquire, and
// Config.Logger of what an operator must know.
//
// While Redis is unreachable Acquire fails within a bound, or, with
// Config.Fallback set to LocalShare, each process admits from its share of
// Capacity until Redis answers again, and then registers there what it
// holds (Inspect says which it does now, even while Redis is away).
//
// A Semaphore implements sluice.Limiter. See docs/semaphore.md for the keys,
// the script and the life of a lease.
package semaphore
