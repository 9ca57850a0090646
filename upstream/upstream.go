// Package upstream reads what an upstream HTTP API says about its limits
// (429 and 503 answers, Retry-After, "remaining" counters, the IETF draft's
// RateLimit fields) and defines Receiver, what a limiter implements to be
// steered by it.
//
// Parse turns a response into a Signal: whether the upstream refused the
// request for its limit, how long it asked to wait, and the state of each
// quota it reported. A limiter that implements Receiver takes the Signal
// with Feedback; package transport does both for every request it sends.
//
// Which headers are read, in which units, is a Headers value: Default reads
// the usual ones (Retry-After, X-RateLimit-*, RateLimit and
// RateLimit-Policy); OpenAI, Anthropic, GitHub and SentinelHub read what
// those APIs send, in their units. See docs/upstream.md for every rule.
//
// The parser never panics and never yields a negative duration: garbage
// reads as "not said", and a header the Headers name that is there but
// cannot be read is listed in Signal.Unreadable, so that it can be
// reported rather than taken for silence. A Retry-After or a reset
// further away than 24 hours reads as 24 hours, a policy window longer than
// 366 days as 366 days, and a count above 2^53 as 2^53.
package upstream

import (
	"context"
	"time"
)

// Signal is what one response said about the upstream's limits.
type Signal struct {
	// Status is the response's status code.
	Status int
	// Refused is true when the upstream refused the request for its limit:
	// a 429; a 503 with a Retry-After; a 403 with a Retry-After or with a
	// quota at Remaining 0 (GitHub answers its primary limit with 403).
	// Other answers, a 403 without either among them, are not refusals.
	Refused bool
	// RetryAfter is how long the upstream asked every client to wait, the
	// longest of the Retry-After headers the Headers name; 0 when none was
	// said (or the date said has passed). It is read on 429, 503 and 403
	// only: on a 3xx, Retry-After is about redirects.
	RetryAfter time.Duration
	// Quotas are the quotas the response reported the state of, in the
	// order the headers were read. Several may count the same unit.
	Quotas []Quota
	// Unreadable are the headers the Headers name that the response sent
	// with a value Parse cannot read (a count that is not a number, a
	// reset in no format it knows), in the order they were read; nil when
	// every one was read. Parse reads such a header as not said: a quota
	// whose Remaining is unreadable is not reported, an unreadable Limit
	// reads as -1, an unreadable Reset as 0, an unreadable Retry-After as
	// none. Package transport logs them.
	Unreadable []Field
}

// Field is a header as a response sent it.
type Field struct {
	// Name is the header's name, as the Headers spell it.
	Name string
	// Value is its value as sent, cut to its first 128 bytes.
	Value string
}

// Quota is the state of one of the upstream's quotas, as one response
// reported it.
type Quota struct {
	// Unit is the sluice unit the quota counts: "" for calls, as a
	// bucket.Policy's Unit ("pu" for Sentinel Hub's processing units). It
	// comes from the Headers configuration, not from the response.
	Unit string
	// Policy is the upstream's own name for the quota when it gives one
	// (the IETF draft's policy names, such as "default"); "" otherwise.
	Policy string
	// Limit is the quota's size; -1 when the response did not say.
	Limit int64
	// Remaining is what is left of the quota now, at least 0. A fractional
	// value is rounded down.
	Remaining int64
	// Reset is how long until the quota is replenished or its window
	// resets; 0 when the response did not say. UntilFull says which.
	Reset time.Duration
	// UntilFull is true when Reset is the time until the quota is full
	// again at its steady rate (OpenAI's and Anthropic's resets), not an
	// instant before which nothing comes back (a window's end, as
	// GitHub's). Such a quota refills all along: a receiver lowers its
	// level to Remaining and lets it go on refilling at its own rate,
	// rather than holding its refills until Reset. It comes from the
	// Headers configuration (Counter.UntilFull), not from the response.
	UntilFull bool
	// Window is the quota's window, from the IETF draft's w= parameter; 0
	// when the response did not say.
	Window time.Duration
}

// Receiver is a limiter steered by the upstream: Feedback takes what one
// response said. Package transport calls it after every response whose
// Signal says something (a refusal, a Retry-After or a quota).
//
// What an implementation does with a Signal s (the rules *bucket.Bucket
// follows, shared by every process using the bucket):
//
//   - Hold: if s.RetryAfter > 0, no process's grant starts before now +
//     s.RetryAfter, measured on the limiter's clock (Redis's for a
//     bucket). Callers already waiting are re-timed after that instant in
//     their order, not released together when it comes.
//   - Sync: for each Quota q, the level of the limiter's policies that
//     count q.Unit is brought down to at most q.Remaining, and their
//     refills resume at now + q.Reset (at once when q.Reset is 0 or
//     q.UntilFull: such a quota refills all along). Sync never raises a
//     level, and never above the configured capacity.
//   - Adapt: if s.Refused, the refusal counts toward lowering the rate in
//     force, when the limiter has adapting enabled.
//
// An implementation documents where it departs from these rules. Feedback
// returns an error only when it could not apply the Signal (a Redis error,
// ctx ended); ctx bounds the call. Implementations are safe for concurrent
// use.
type Receiver interface {
	Feedback(ctx context.Context, s Signal) error
}
