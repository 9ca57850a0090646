package protocol

import (
	"math"
	"strconv"
	"strings"
	"time"
)

// Policy is one limit of a bucket: it holds at most Capacity tokens of its
// Unit ("" counts calls) and gains RefillAmount tokens every
// RefillFrequency (used in whole microseconds). A caller without costs of
// its own takes its call from each policy: 1 token, or 0 from a policy
// that counts another unit than calls.
//
// Kind makes it a window of length RefillFrequency (tokens.lua, "Windows"):
// Fixed is a token bucket whose RefillAmount is its Capacity, refilled at
// whole multiples of the window (plus a lag) on the Redis clock; Rolling
// grants at most Capacity in any window, each grant coming back the window
// after it (its grants are logged in the key Keys.Window names).
type Policy struct {
	Unit            string
	Capacity        int64
	RefillAmount    int64
	RefillFrequency time.Duration
	Kind            Kind
}

// Kind is what kind of limit a Policy is.
type Kind int

// The kinds of Policy; the scripts read them as numbers.
const (
	TokenBucket Kind = 0
	Fixed       Kind = 1
	Rolling     Kind = 2
)

// Call is what a caller without costs of its own takes from p.
func (p Policy) Call() int64 {
	if p.Unit != "" {
		return 0
	}
	return 1
}

// PolicyArgs are the policies as the scripts read them (read_policies in
// tokens.lua): their configuration's id (ConfigID), n, then capacity,
// amount, period µs, call and kind of each.
func PolicyArgs(ps []Policy) []any {
	args := []any{ConfigID(ps), len(ps)}
	for _, p := range ps {
		args = append(args, p.Capacity, p.RefillAmount, p.RefillFrequency.Microseconds(), p.Call(), int(p.Kind))
	}
	return args
}

// Refill is tokens.lua's refill in integer µs: it brings a policy's level
// and anchor (the instant of the last refill counted) forward to now.
// A Rolling policy's level comes back only as its log expires, which Refill
// cannot read: it returns the level as stored, at most what it holds.
func Refill(level, anchor, now int64, p Policy) (int64, int64) {
	freq := p.RefillFrequency.Microseconds()
	if now > anchor && freq > 0 && p.Kind != Rolling {
		if n := (now - anchor) / freq; n > 0 {
			level = min(p.Capacity, level+n*p.RefillAmount)
			anchor += n * freq
		}
	}
	return level, anchor
}

// RefillLagMax is tokens.lua's REFILL_LAG_US: the longest a token
// bucket's refills start after a grant that took it below its capacity.
const RefillLagMax = 5000

// RefillLag is tokens.lua's refill_lag, µs: how long after the slot of a
// grant that takes a full TokenBucket policy below its capacity its
// refills start (take_at; a new bucket's by load), min(fill / 2,
// RefillLagMax), fill being ⌈Capacity / RefillAmount⌉ periods.
func RefillLag(p Policy) int64 {
	freq := p.RefillFrequency.Microseconds()
	switch {
	case p.RefillAmount < 1:
		return RefillLagMax
	case freq < 1:
		return 0
	}
	n := p.Capacity / p.RefillAmount
	if p.Capacity%p.RefillAmount != 0 {
		n++
	}
	if n >= (2*RefillLagMax+freq-1)/freq { // n*freq ≥ 2*RefillLagMax, without overflow
		return RefillLagMax
	}
	return n * freq / 2
}

// LagShift is tokens.lua's lag_shift: how far (µs) a grant at slot moves
// a TokenBucket policy's grid of refills, before being its level at the
// slot and at its last refill by then.
func LagShift(p Policy, before, slot, at int64) int64 {
	if p.Kind != TokenBucket || at == slot {
		return 0 // the refill that filled it came at the slot: it never sat full
	}
	// In float64, as the Lua: the product may pass 2^63.
	back := math.Floor(float64(p.Capacity-before)/float64(p.RefillAmount)) * float64(p.RefillFrequency.Microseconds())
	if d := float64(slot+RefillLag(p)-at) - back; d > 0 {
		return int64(d)
	}
	return 0
}

// SlotFor is tokens.lua's slot_all for one policy: when the k-th token from
// now on is due (now itself if the level covers it). For a Rolling policy,
// whose log it cannot read, it is a lower bound: now. A full TokenBucket
// policy counts from the lag after now (tokens.lua's lag_anchor).
func SlotFor(level, anchor, now, k int64, p Policy) int64 {
	if level >= k || p.Kind == Rolling {
		return now
	}
	if p.Kind == TokenBucket && level >= p.Capacity {
		anchor = max(anchor, now+RefillLag(p))
	}
	need := k - level
	slot := anchor + (need+p.RefillAmount-1)/p.RefillAmount*p.RefillFrequency.Microseconds()
	return max(slot, now)
}

// WindowEntry is one entry of a rolling window's log: the grants of one
// slot (µs) and their cost.
type WindowEntry struct {
	Slot, Cost int64
}

// ParseWindowEntry reads an entry as tokens.lua writes it, "slot cost".
func ParseWindowEntry(raw string) (WindowEntry, bool) {
	var e WindowEntry
	a, b, ok := strings.Cut(raw, " ")
	if !ok {
		return e, false
	}
	var err1, err2 error
	e.Slot, err1 = strconv.ParseInt(a, 10, 64)
	e.Cost, err2 = strconv.ParseInt(b, 10, 64)
	return e, err1 == nil && err2 == nil
}

// WindowSpan is tokens.lua's window_span: how long after its slot a
// rolling window's grant still counts, µs.
func WindowSpan(p Policy) int64 {
	w := p.RefillFrequency.Microseconds()
	return w + min(w/2, RefillLagMax)
}

// WindowRefill is tokens.lua's window_refill: a rolling policy's level at
// now, given its log, and the entries still in the window.
func WindowRefill(level int64, log []WindowEntry, now int64, p Policy) (int64, []WindowEntry) {
	span := WindowSpan(p)
	for len(log) > 0 && log[0].Slot+span < now {
		level = min(p.Capacity, level+log[0].Cost)
		log = log[1:]
	}
	return level, log
}

// WindowSlot is tokens.lua's window_slot: when a rolling policy at level,
// with the entries still in its window, can give its k-th token (past the
// log, a lower bound).
func WindowSlot(level int64, log []WindowEntry, now, k int64, p Policy) int64 {
	if level >= k {
		return now
	}
	need, acc, last := k-level, int64(0), now
	for _, e := range log {
		acc += e.Cost
		last = e.Slot
		if acc >= need {
			return max(now, e.Slot+WindowSpan(p)+1)
		}
	}
	return max(now, last) + WindowSpan(p) + 1
}
