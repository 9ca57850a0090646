package sluice

import "time"

// Observability: every limiter in this module reports each finished call
// to an Observer (its Config's Observer field, nil meaning none, which
// costs nothing) and keeps counters of this process that Stats reads
// without I/O. Packages that turn these into metrics (OpenTelemetry,
// Prometheus) live in modules of their own, so that a user who imports
// neither pays for neither. See docs/observability.md.

// Observer receives every call to enter a limiter once it returns. Observe
// runs on the caller's goroutine before the call returns (a bucket in
// shadow mode's events excepted: Event.Shadow): it must be
// fast, must not block, and must be safe for concurrent use.
type Observer interface {
	Observe(e Event)
}

// Event is one finished call to enter a limiter (Enter, EnterCost,
// Acquire, Do's entry, ...).
type Event struct {
	// Limiter is the kind: "bucket", "semaphore", "local.rate",
	// "local.concurrency", "local.spacer".
	Limiter string
	// Name is the limiter's name (Config.Name of a bucket or semaphore),
	// "" for the in-process limiters.
	Name string
	// Lane is the caller's lane (bucket.WithLane), "" for the default
	// lane, for a limiter that serves no lanes, and for a lane name the
	// limiter refused (the call failed with ErrConfig). The metrics
	// packages label each lane apart up to a bound, and the rest as
	// "other".
	Lane   string
	Result Result
	// Reason says why, for a Refused or Failed result: "queue_full",
	// "wait_too_long", "cost_exceeds_capacity", "timeout", "limited" (another
	// refusal), "config_mismatch", "config", "not_replicated", "closed",
	// "redis" (a failed call to Redis), "error" (anything else, such as a
	// bad argument); "" otherwise.
	Reason string
	// Wait is from the call to its return.
	Wait time.Duration
	// Queued reports that the caller waited in the queue (it was not
	// granted on arrival).
	Queued bool
	// Late is, for a rate limiter's grant, how late after its slot the
	// call returned (0 when on time or unknown).
	Late time.Duration
	// Reentries counts the times the caller entered again (a stale or
	// lost slot) before this result.
	Reentries int
	// Local reports that the call was admitted by this process's local
	// share while Redis could not be reached (Config.Fallback of a bucket
	// or a semaphore), or failed while waiting there.
	Local bool
	// Shadow reports a call of a bucket in shadow mode
	// (bucket.Config.Shadow): the call was let through at once, and
	// Result, Reason and Wait are what the limiter would have done:
	// Granted after Wait, Refused (its deadline or MaxWait shorter than
	// that wait), or Failed (Redis did not answer). Such an event is
	// observed when Redis answered, on the bucket's goroutine, not the
	// caller's. The metrics packages record it as sluice.shadow_wait
	// only.
	Shadow bool
}

// Result is how a call to enter a limiter ended.
type Result int

const (
	// Granted: the caller may start (it holds a permit, for a
	// concurrency limiter).
	Granted Result = iota
	// Refused: refused without waiting its turn (ErrLimited, or
	// ErrCostExceedsCapacity); it took nothing.
	Refused
	// Canceled: the caller's ctx ended first.
	Canceled
	// Failed: any other error (Redis, a configuration mismatch, Close).
	Failed
)

// String is the result as a metric attribute: "granted", "refused",
// "canceled", "failed".
func (r Result) String() string {
	switch r {
	case Granted:
		return "granted"
	case Refused:
		return "refused"
	case Canceled:
		return "canceled"
	case Failed:
		return "failed"
	}
	return "unknown"
}

// Stats are one limiter's figures in this process, read without I/O.
// Counters count since the limiter was made; a field a limiter has no use
// for stays 0.
type Stats struct {
	// Waiting is the callers waiting in this process now.
	Waiting int64
	// Held is the weight this process holds now (semaphore, concurrency
	// limiter).
	Held int64
	// Results of the calls that returned, as reported to the Observer.
	Granted, Refused, Canceled, Failed int64
	// Reentries counts the times callers entered again (bucket).
	Reentries int64
	// The bucket's scheduler in this process: steps run, steps refused
	// because another process had taken the lock, and steps or lock
	// requests that failed.
	Steps, Fenced, Errors int64
	// LeasesLost counts the semaphore's permits whose lease ran out
	// while held.
	LeasesLost int64
	// Local reports that the limiter admits from this process's local
	// share now, Redis being unreachable (Config.Fallback of a bucket or
	// a semaphore); LocalGranted counts the calls its share granted
	// (included in Granted).
	Local        bool
	LocalGranted int64
	// Shadow counts the calls a bucket in shadow mode
	// (bucket.Config.Shadow) let through, as they are heard back from
	// Redis; of them, ShadowRefused the ones the limiter would have
	// refused and ShadowFailed the ones Redis did not answer for.
	// ShadowWait is the sum of the waits the others would have had: its
	// mean is ShadowWait / (Shadow − ShadowRefused − ShadowFailed).
	// The calls themselves count in no other field.
	Shadow, ShadowRefused, ShadowFailed int64
	ShadowWait                          time.Duration
}

// StatsReader is a limiter whose Stats can be read.
type StatsReader interface {
	Stats() Stats
}
