package queueio

import (
	"time"

	"github.com/sluicehq/sluice/internal/protocol"
)

// Arrival is what Queue.Enqueue learned of one caller. Exactly one holds:
// Err is set (refused: nothing consumed); Entry is set (queued: poll with
// it); or neither (the caller has its slot, Delay from now).
type Arrival struct {
	Err   error         // ErrQueueFull or ErrWaitTooLong
	Entry string        // queued: how the caller is known from now on, to Poll and Cancel
	Delay time.Duration // until the slot, or the estimate of it when queued or refused for its wait; from Now
	// Position is the 1-based place in the queue (queued callers, and
	// those refused at it); 0 for a caller given its slot at once.
	Position         int
	SchedulerRunning bool  // queued: the scheduler lock was held
	Ticket           int64 // arrival order at Redis (callers not refused)
	Slot             int64 // given a slot at once: the slot, µs on the Redis clock (for analysis only)
	Now              int64 // the Redis clock (µs) when the call read it: Delay is from then
	// Lanes: named lanes had callers (bucket.WithLane), so a queued
	// caller's Delay is the estimate of its share, not the back of the
	// queue.
	Lanes bool
	// Claim (queued): a slot nobody came for is due; poll at once, to
	// claim it (Poll).
	Claim bool
}

// Queued reports whether the caller waits in the queue.
func (a Arrival) Queued() bool { return a.Err == nil && a.Entry != "" }

// PollReply is what Queue.Poll found. At most one of Found, Stale and
// Lost holds; none: the caller is still queued.
type PollReply struct {
	Found bool // a slot: start after Delay (negative: late)
	Stale bool // the slot passed more than MaxLateness ago, or a running caller took it (Room ""); its token is spent: Retime
	Lost  bool // the caller is neither queued nor scheduled: enter again
	// Claimed (with Found): the slot is one whose caller did not come for
	// it, taken in exchange for this caller's later one, or by this
	// caller still queued, which left the queue
	// (internal/protocol/claim.lua); Swapped (with Found or Stale): this
	// caller did not come for its own slot in time, and a running caller
	// took it and gave it this later one.
	Claimed, Swapped bool
	// Delay is until the slot (Found, Stale) or the estimate of it (still
	// queued), from when Redis read its clock.
	Delay    time.Duration
	Position int           // still queued: 1-based place in the queue
	LockTTL  time.Duration // still queued: the scheduler lock's remaining TTL, < 0 if none
	// Told (still queued): the slot will come on the wake channel
	// (notices), for it is not the entry's estimate: callers ahead were
	// late and took the next slots first. The caller waits for it rather
	// than polling again at each new estimate.
	Told bool
	Slot int64 // Found: the slot, µs on the Redis clock (for analysis only)
	// Room is what the step that gave the slot left for Retime (Found,
	// Stale): a caller too late to use its slot passes it back.
	Room string
	// RoundTrips is how many round trips the poll took: 1, or 2 when the
	// direct poll found no slot and the script ran after it, or claimed
	// a slot.
	RoundTrips int
}

// Retimed is what Queue.Retime did.
type Retimed struct {
	Delay    time.Duration // until the new slot, from when Redis read its clock
	Slot     int64         // the new slot, µs on the Redis clock (for analysis only)
	Refunded bool          // the missed slot's tokens were still there: the caller starts now (Delay 0) with them
	// Claimed: the caller was given another caller's slot, which that
	// caller had not come for (Delay negative: it starts at once), and
	// that caller the next slot instead (internal/protocol/claim.lua).
	Claimed bool
	Room    string // the new slot's room, for a caller late again
	// Entry (set when Retime wrote the next slot rather than told it):
	// the caller polls for its slot (Poll) as a queued caller does, a
	// lead before Delay from Now.
	Entry string
	Now   int64 // the Redis clock (µs) when the script read it
}

// Sync brings one policy's level down to what the upstream says remains
// (Queue.Feedback).
type Sync struct {
	Policy    int           // index in the policies the Queue runs under
	Remaining int64         // tokens left upstream; the level is lowered to it, never raised
	Reset     time.Duration // when lowered, the policy's refills resume no sooner than this from now; 0: at once
}

// FeedbackResult is what Queue.Feedback did.
type FeedbackResult struct {
	Owed    int // slots already handed out (within the lookahead) that the hold did not stop
	Lowered int // syncs that lowered a level
}

// ChangeResult is what Queue.Change did.
type ChangeResult struct {
	Changed bool            // false: next declined, or the policies were the same
	New     protocol.Config // the configuration in force now
	Queued  int             // callers queued under the new policies
}
