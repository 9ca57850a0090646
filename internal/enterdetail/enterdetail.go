// Package enterdetail carries the figures of one bucket Enter that only
// the bench and the tests read: the caller's slot on the Redis clock, how
// early its reply came, its polls, its round trips and its refunds. They
// are not part of bucket.Report, which says what a user can act on.
//
// A caller asks for them by giving Enter a ctx made by With; the bucket
// looks the Detail up once per call and fills it when the call returns
// (granted or not). A ctx without one costs that lookup and nothing else.
//
//	var d enterdetail.Detail
//	rep, err := b.EnterReport(enterdetail.With(ctx, &d))
package enterdetail

import (
	"context"
	"time"
)

// Detail is what one Enter did beyond its bucket.Report. The zero value is
// an Enter that made no call to Redis.
type Detail struct {
	// Slot is the instant the caller's tokens were due, on the Redis
	// clock (zero: none was given). It is for analysis only: comparing it
	// with the local clock assumes both are synchronised.
	Slot time.Time
	// Arrived is the Redis clock when the caller's last arrival was
	// handled (zero: none was): Slot less Arrived is its wait as Redis
	// judges it, whatever its own process's delays.
	Arrived time.Time
	// Margin is how long before its slot the caller held the reply that
	// gave it the slot, at least (as if Redis read its clock the moment
	// the request left). Zero or less: the reply came at or after the
	// slot, so the caller was late before its final wait began, through
	// Redis, the network or its own process being slow; otherwise a late
	// return is the final wait's.
	Margin time.Duration
	// Polls counts the polls for a slot (1 in the normal queued case).
	Polls int
	// RoundTrips counts the Redis round trips made for this caller.
	RoundTrips int
	// Refunds counts the retimed slots (bucket.Report.Retimes) whose
	// tokens stayed unused in the bucket: the caller started at once with
	// them; the others were spent.
	Refunds int
	// Claims counts the slots this caller took from callers that had not
	// come for them (queueio.PollReply.Claimed, queueio.Retimed.Claimed).
	Claims int
}

type key struct{}

// With returns a ctx that asks Enter to fill d. d must not be read until
// that Enter returned, and one Detail serves one call at a time.
func With(ctx context.Context, d *Detail) context.Context {
	return context.WithValue(ctx, key{}, d)
}

// From returns the Detail ctx carries, or nil.
func From(ctx context.Context) *Detail {
	d, _ := ctx.Value(key{}).(*Detail)
	return d
}
