package upstream

// The ready-made Headers sets for APIs that document what they send.

// Default reads Retry-After (seconds or an HTTP-date), X-RateLimit-Limit /
// -Remaining / -Reset and X-Rate-Limit-Limit / -Remaining / -Reset (X's
// spelling) as quotas of calls, and the IETF draft's fields as quotas of
// calls. Treat it as read-only: copy it to change it.
var Default = Headers{
	RetryAfter: []Delay{{Name: "Retry-After"}},
	Counters: []Counter{
		{Limit: "X-RateLimit-Limit", Remaining: "X-RateLimit-Remaining", Reset: "X-RateLimit-Reset"},
		{Limit: "X-Rate-Limit-Limit", Remaining: "X-Rate-Limit-Remaining", Reset: "X-Rate-Limit-Reset"},
	},
	Draft: true,
}

// OpenAI reads what OpenAI's API sends (its rate limits guide): Retry-After
// in seconds, and two quotas, both UntilFull: x-ratelimit-limit-requests /
// -remaining-requests / -reset-requests as calls (unit ""), and
// x-ratelimit-limit-tokens / -remaining-tokens / -reset-tokens in unit
// "tokens". The resets are Go-style durations ("1s", "6m0s", "20ms"): the
// time until the quota is back to its full size, at its steady rate. Treat
// it as read-only: copy it to change it.
var OpenAI = Headers{
	RetryAfter: []Delay{{Name: "retry-after"}},
	Counters: []Counter{
		{Limit: "x-ratelimit-limit-requests", Remaining: "x-ratelimit-remaining-requests",
			Reset: "x-ratelimit-reset-requests", UntilFull: true},
		{Unit: "tokens", Limit: "x-ratelimit-limit-tokens", Remaining: "x-ratelimit-remaining-tokens",
			Reset: "x-ratelimit-reset-tokens", UntilFull: true},
	},
}

// Anthropic reads what Anthropic's API sends (its rate limits page):
// Retry-After in seconds, and four quotas, all UntilFull, from the
// anthropic-ratelimit-<kind>-limit / -remaining / -reset headers: requests
// as calls (unit ""), tokens in unit "tokens" (the most restrictive of the
// token limits in force), input-tokens in unit "input_tokens" and
// output-tokens in unit "output_tokens". The resets are RFC 3339
// timestamps ("2024-06-21T17:34:00Z"): when the quota will be fully
// replenished. Anthropic rounds the tokens remaining to the nearest
// thousand. Treat it as read-only: copy it to change it.
var Anthropic = Headers{
	RetryAfter: []Delay{{Name: "retry-after"}},
	Counters: []Counter{
		anthropic("", "requests"),
		anthropic("tokens", "tokens"),
		anthropic("input_tokens", "input-tokens"),
		anthropic("output_tokens", "output-tokens"),
	},
}

func anthropic(unit, kind string) Counter {
	p := "anthropic-ratelimit-" + kind + "-"
	return Counter{Unit: unit, Limit: p + "limit", Remaining: p + "remaining", Reset: p + "reset", UntilFull: true}
}

// GitHub reads what GitHub's REST API sends (its rate limits page):
// Retry-After in seconds (its secondary limits), and one quota of calls
// from x-ratelimit-limit, -remaining and -reset, a Unix time in seconds
// when the window resets (the quota comes back all at once then, so it is
// not UntilFull), named by x-ratelimit-resource ("core", "search", ...:
// Quota.Policy). GitHub answers its limits with 403 or 429: a 403 is a
// refusal when it has a Retry-After or x-ratelimit-remaining 0 (see
// Signal.Refused). x-ratelimit-used is not read: it is the limit less
// the remaining. Treat it as read-only: copy it to change it.
var GitHub = Headers{
	RetryAfter: []Delay{{Name: "retry-after"}},
	Counters: []Counter{{Limit: "x-ratelimit-limit", Remaining: "x-ratelimit-remaining",
		Reset: "x-ratelimit-reset", Policy: "x-ratelimit-resource"}},
}

// SentinelHub reads what Sentinel Hub sends: Retry-After and
// X-ProcessingUnits-Retry-After in milliseconds, X-RateLimit-Remaining as
// the calls left, and X-ProcessingUnits-Remaining as the processing units
// left, in unit "pu" (fractional values are rounded down). Sentinel Hub
// sends no reset or limit headers. Treat it as read-only: copy it to change
// it.
var SentinelHub = Headers{
	RetryAfter: []Delay{
		{Name: "Retry-After", Millis: true},
		{Name: "X-ProcessingUnits-Retry-After", Millis: true},
	},
	Counters: []Counter{
		{Remaining: "X-RateLimit-Remaining"},
		{Unit: "pu", Remaining: "X-ProcessingUnits-Remaining"},
	},
}
