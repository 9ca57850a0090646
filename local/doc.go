// Package local holds the in-process limiters: the ones to use when every
// caller lives in one process and no Redis is needed. Each satisfies the
// sluice interfaces, so code written against sluice.Limiter or
// sluice.RateLimiter can switch between these, the Redis-backed limiters and
// Noop without touching its call sites.
//
//   - Rate lets at most Rate calls start per Period, first come first served,
//     with optional Burst, MaxQueue and MaxWait. EnterN takes a cost of
//     several calls at once. Its Feedback (upstream.Receiver) lets the
//     upstream's Retry-After and remaining counters hold and lower it, as
//     package transport does after every response.
//   - Concurrency lets at most Limit calls run at once, first come first
//     served, with an optional acquire timeout and an optional bound on a
//     whole Do (wait plus work). AcquireN takes several slots at once.
//   - Spacer starts calls at least Space apart, optionally on multiples of
//     Space.
//   - Noop never waits and never refuses; it turns limiting off.
//
// # What each adds over the library it wraps
//
// Rate keeps its tokens in a golang.org/x/time/rate Limiter and adds a FIFO
// queue of waiters in front of it in which only the front waiter holds a
// reservation. The library on its own gives every waiter a reservation at
// once, and its Reservation.Cancel cannot return a slot that later
// reservations have already counted on, so a cancelled waiter in the middle of
// the queue would leave a hole and everyone behind it would wait for nothing.
// Here a cancelled waiter simply leaves the queue, and the ones behind move up.
// On top of that Rate adds MaxQueue and MaxWait refusals (which reserve
// nothing), an expected-wait estimate that includes the front waiter's
// remaining sleep, sentinel errors and Do. It also guards against the
// library's nanosecond rounding, which can start a call up to 1 ns early and
// so let Rate+1 calls into one Period: the token interval it configures is
// Period/Rate plus 2 ns.
//
// Spacer uses the same queue with its own schedule (the last start plus
// Space, rounded up to a multiple of Space when Align is set), so it inherits
// the same cancellation behaviour.
//
// Concurrency wraps a golang.org/x/sync/semaphore Weighted of size Limit,
// which already queues FIFO and handles cancellation. It adds the acquire
// timeout (ErrTimeout rather than a context error), RunTimeout for Do, a Do
// that releases even when fn panics, and sentinel errors.
//
// # Errors
//
// Refusals are the sentinels sluice.ErrQueueFull, sluice.ErrWaitTooLong and ErrTimeout, each
// wrapping sluice.ErrLimited; test them with errors.Is. A refused call has
// consumed nothing. A cost that could never be granted (above Burst or
// Limit) is refused at once with an error matching sluice.ErrCostExceedsCapacity, which does not wrap
// sluice.ErrLimited: waiting would not help. When the caller's context ends first, the limiters return
// an error that matches ctx.Err() with errors.Is, and whatever the caller had
// reserved is given back. Constructors return errors wrapping
// sluice.ErrConfig and never panic.
//
// Rate, Concurrency and Spacer count their calls for Stats (a
// sluice.StatsReader) and tell the Observer of their config, if any, of
// each one as it returns.
//
// All limiters are safe for concurrent use, and start no goroutines of their
// own: every wait happens in the caller's goroutine.
package local
