package protocol

import (
	"strings"
	"time"
)

// ClaimReach is the furthest after its instant that any caller claims an
// uncollected slot (claim.lua): the step drops older entries of the due
// set. step.lua spells it out (1000000 µs).
const ClaimReach = time.Second

// swapped is claim.lua's SWAPPED: the end of a slot value given in
// exchange for one a running caller claimed.
const swapped = " s"

// Swapped reads a room (ParseSlotValue's) for claim.lua's mark: the slot
// was given in exchange for the caller's own, which a running caller took
// because this one had not come for it. It returns the room without the
// mark.
func Swapped(room string) (string, bool) {
	r, ok := strings.CutSuffix(room, swapped)
	return r, ok
}

// taken is claim.lua's TAKEN: the room of a slot value whose slot a
// running caller that held none of its own took.
const taken = "t"

// Taken reads a room (ParseSlotValue's) for claim.lua's TAKEN: a running
// caller that held no slot took this caller's, because this one had not
// come for it; its caller is served as one too late for its slot.
func Taken(room string) bool { return room == taken }

// SameHandle says whether queue entries (or IDs) a and b are of callers
// of one handle: their IDs share its prefix, up to the first '.'
// (bucket's IDs; claim.lua claims only from other handles).
func SameHandle(a, b string) bool {
	pa, ok := handlePrefix(a)
	pb, okb := handlePrefix(b)
	return ok && okb && pa == pb
}

func handlePrefix(e string) (string, bool) {
	id, _, _ := strings.Cut(e, "|")
	p, _, ok := strings.Cut(id, ".")
	return p, ok
}

// ClaimAfter is how long after its instant a slot still uncollected says
// that its caller's process is stopped, so that a running caller may
// claim it (ClaimWindow's near end): its caller polls a lead of at
// least 1 ms before it, and did not run for 4 ms or more.
const ClaimAfter = 3 * time.Millisecond

// ClaimWindow is how long after an uncollected slot's instant a caller
// whose MaxLateness is maxLate claims it (claim.lua), as offsets back
// from Redis's now, in µs: from hi (the slot's caller, which polls a lead
// of at least 1 ms before it, did not run for 4 ms or more: ClaimAfter, or
// half of maxLate when that is less) to lo (the claimer, starting at
// once, still starts within maxLate of the slot: a fifth of it, at least
// 1 ms, is left for its reply's trip and its own wake-up). 0, 0: the
// caller claims nothing (maxLate negative, or too short to leave a
// window).
//
// Half of maxLate (12.5 ms by default) until 2026-11-29: in the bench's
// pods (processes at their CPU limit, stopped for most of each 100 ms)
// a slot left uncollected waited that long for a claimer, often into
// the claimer's own stop (docs/design.md, "A process that stops,
// watched").
func ClaimWindow(maxLate time.Duration) (lo, hi int64) {
	lateLo := min(maxLate-max(maxLate/5, time.Millisecond), ClaimReach)
	lateHi := min(maxLate/2, ClaimAfter)
	if maxLate <= 0 || lateLo <= lateHi {
		return 0, 0
	}
	return lateLo.Microseconds(), lateHi.Microseconds()
}
