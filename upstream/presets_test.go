package upstream

import (
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"
)

// TestPresets reads what each provider's documentation shows its API
// sending, with that provider's Headers. Where the page shows values, they
// are copied as they are; the page is named above each group.
func TestPresets(t *testing.T) {
	tests := []struct {
		name    string
		headers Headers
		resp    *http.Response
		want    Signal
	}{
		// OpenAI, "Rate limits" guide (platform.openai.com/docs/guides/
		// rate-limits), "Rate limits in headers": the table's sample
		// values. Both resets are "the time until the rate limit ...
		// resets to its initial state": until full.
		{"OpenAI: the guide's sample values", OpenAI,
			resp(200,
				"x-ratelimit-limit-requests: 60",
				"x-ratelimit-limit-tokens: 150000",
				"x-ratelimit-remaining-requests: 59",
				"x-ratelimit-remaining-tokens: 149984",
				"x-ratelimit-reset-requests: 1s",
				"x-ratelimit-reset-tokens: 6m0s"),
			Signal{Status: 200, Quotas: []Quota{
				{Limit: 60, Remaining: 59, Reset: time.Second, UntilFull: true},
				{Unit: "tokens", Limit: 150000, Remaining: 149984, Reset: 6 * time.Minute, UntilFull: true}}}},
		// The same headers, in the other Go duration shapes the API sends
		// (milliseconds, a fraction of a second), on a 429 with Retry-After.
		{"OpenAI: 429, milliseconds and fractional durations", OpenAI,
			resp(429,
				"retry-after: 2",
				"x-ratelimit-limit-requests: 60",
				"x-ratelimit-remaining-requests: 0",
				"x-ratelimit-reset-requests: 20ms",
				"x-ratelimit-limit-tokens: 150000",
				"x-ratelimit-remaining-tokens: 0",
				"x-ratelimit-reset-tokens: 1m30.5s"),
			Signal{Status: 429, Refused: true, RetryAfter: 2 * time.Second, Quotas: []Quota{
				{Limit: 60, Remaining: 0, Reset: 20 * time.Millisecond, UntilFull: true},
				{Unit: "tokens", Limit: 150000, Remaining: 0, Reset: 90500 * time.Millisecond, UntilFull: true}}}},

		// Anthropic, "Rate limits" (docs.anthropic.com/en/api/rate-limits),
		// "Response headers": the page names the headers and their formats
		// (a reset is "the time when the rate limit will be fully
		// replenished, provided in RFC 3339 format"; retry-after is "the
		// number of seconds to wait") but shows no sample values: these are
		// in its formats.
		{"Anthropic: every family against Date", Anthropic,
			resp(200,
				"Date: Fri, 21 Jun 2024 17:33:00 GMT",
				"anthropic-ratelimit-requests-limit: 50",
				"anthropic-ratelimit-requests-remaining: 49",
				"anthropic-ratelimit-requests-reset: 2024-06-21T17:33:01Z",
				"anthropic-ratelimit-tokens-limit: 8000",
				"anthropic-ratelimit-tokens-remaining: 7000",
				"anthropic-ratelimit-tokens-reset: 2024-06-21T17:34:00Z",
				"anthropic-ratelimit-input-tokens-limit: 40000",
				"anthropic-ratelimit-input-tokens-remaining: 39000",
				"anthropic-ratelimit-input-tokens-reset: 2024-06-21T17:33:02Z",
				"anthropic-ratelimit-output-tokens-limit: 8000",
				"anthropic-ratelimit-output-tokens-remaining: 7000",
				"anthropic-ratelimit-output-tokens-reset: 2024-06-21T17:34:00Z"),
			Signal{Status: 200, Quotas: []Quota{
				{Limit: 50, Remaining: 49, Reset: time.Second, UntilFull: true},
				{Unit: "tokens", Limit: 8000, Remaining: 7000, Reset: time.Minute, UntilFull: true},
				{Unit: "input_tokens", Limit: 40000, Remaining: 39000, Reset: 2 * time.Second, UntilFull: true},
				{Unit: "output_tokens", Limit: 8000, Remaining: 7000, Reset: time.Minute, UntilFull: true}}}},
		{"Anthropic: 429 with retry-after, a reset with a fraction and an offset", Anthropic,
			resp(429,
				"Date: Fri, 21 Jun 2024 17:33:00 GMT",
				"retry-after: 30",
				"anthropic-ratelimit-output-tokens-limit: 8000",
				"anthropic-ratelimit-output-tokens-remaining: 0",
				"anthropic-ratelimit-output-tokens-reset: 2024-06-21T19:33:30.5+02:00"),
			Signal{Status: 429, Refused: true, RetryAfter: 30 * time.Second, Quotas: []Quota{
				{Unit: "output_tokens", Limit: 8000, Remaining: 0, Reset: 30500 * time.Millisecond, UntilFull: true}}}},

		// GitHub, "Getting started with the REST API" (docs.github.com/en/
		// rest/using-the-rest-api/getting-started-with-the-rest-api), "About
		// the response code and headers": the curl example's headers.
		// x-ratelimit-reset is "the time at which the current rate limit
		// window resets, in UTC epoch seconds" ("Rate limits for the REST
		// API"): a window's end, not until full.
		{"GitHub: the getting-started example", GitHub,
			resp(200,
				"date: Thu, 04 Aug 2022 20:07:51 GMT",
				"x-ratelimit-limit: 15000",
				"x-ratelimit-remaining: 14996",
				"x-ratelimit-reset: 1659645535",
				"x-ratelimit-resource: core",
				"x-ratelimit-used: 4"),
			Signal{Status: 200, Quotas: []Quota{
				{Policy: "core", Limit: 15000, Remaining: 14996, Reset: 31*time.Minute + 4*time.Second}}}},
		// GitHub, "Resources in the REST API", "Rate limiting": the example
		// of an exceeded primary limit, a 403 with x-ratelimit-remaining 0.
		{"GitHub: primary limit exceeded, 403", GitHub,
			resp(403,
				"Date: Tue, 20 Aug 2013 14:50:41 GMT",
				"x-ratelimit-limit: 60",
				"x-ratelimit-remaining: 0",
				"x-ratelimit-used: 60",
				"x-ratelimit-reset: 1377013266"),
			Signal{Status: 403, Refused: true, Quotas: []Quota{
				{Limit: 60, Remaining: 0, Reset: 50*time.Minute + 25*time.Second}}}},
		// "Rate limits for the REST API", "Exceeding the rate limit": a
		// primary limit may be answered with 429 too, and a secondary
		// limit with 403 or 429 and retry-after, in seconds.
		{"GitHub: primary limit exceeded, 429", GitHub,
			resp(429,
				"Date: Tue, 20 Aug 2013 14:50:41 GMT",
				"x-ratelimit-limit: 60",
				"x-ratelimit-remaining: 0",
				"x-ratelimit-reset: 1377013266",
				"x-ratelimit-resource: core"),
			Signal{Status: 429, Refused: true, Quotas: []Quota{
				{Policy: "core", Limit: 60, Remaining: 0, Reset: 50*time.Minute + 25*time.Second}}}},
		{"GitHub: secondary limit, 403 with retry-after", GitHub,
			resp(403,
				"Date: Tue, 20 Aug 2013 14:50:41 GMT",
				"retry-after: 60",
				"x-ratelimit-limit: 5000",
				"x-ratelimit-remaining: 4990",
				"x-ratelimit-reset: 1377013266",
				"x-ratelimit-resource: core"),
			Signal{Status: 403, Refused: true, RetryAfter: time.Minute, Quotas: []Quota{
				{Policy: "core", Limit: 5000, Remaining: 4990, Reset: 50*time.Minute + 25*time.Second}}}},
		{"GitHub: a 403 with quota left and no retry-after is not a refusal", GitHub,
			resp(403,
				"x-ratelimit-limit: 5000",
				"x-ratelimit-remaining: 4990",
				"x-ratelimit-resource: search"),
			Signal{Status: 403, Quotas: []Quota{{Policy: "search", Limit: 5000, Remaining: 4990}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.headers.parseAt(tt.resp, now)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
			check(t, got)
		})
	}
}

// TestUnreadable: a header the Headers name that is there with a value
// that cannot be read is reported, as sent, never read as 0 in silence.
func TestUnreadable(t *testing.T) {
	long := strings.Repeat("9x", 100)
	tests := []struct {
		name    string
		headers Headers
		resp    *http.Response
		want    Signal
	}{
		{"OpenAI: a reset in words", OpenAI,
			resp(200, "x-ratelimit-remaining-tokens: 10", "x-ratelimit-reset-tokens: 6 minutes"),
			Signal{Status: 200, Quotas: []Quota{{Unit: "tokens", Limit: -1, Remaining: 10, UntilFull: true}},
				Unreadable: []Field{{"x-ratelimit-reset-tokens", "6 minutes"}}}},
		{"Anthropic: a reset that is not RFC 3339", Anthropic,
			resp(200, "anthropic-ratelimit-requests-remaining: 3", "anthropic-ratelimit-requests-reset: 2024-06-21 17:34"),
			Signal{Status: 200, Quotas: []Quota{{Limit: -1, Remaining: 3, UntilFull: true}},
				Unreadable: []Field{{"anthropic-ratelimit-requests-reset", "2024-06-21 17:34"}}}},
		{"Anthropic: remaining in words yields no quota", Anthropic,
			resp(200, "anthropic-ratelimit-tokens-limit: 8000", "anthropic-ratelimit-tokens-remaining: plenty"),
			Signal{Status: 200, Unreadable: []Field{{"anthropic-ratelimit-tokens-remaining", "plenty"}}}},
		{"GitHub: limit, reset and retry-after garbled", GitHub,
			resp(429, "retry-after: soon", "x-ratelimit-limit: sixty", "x-ratelimit-remaining: 0", "x-ratelimit-reset: tomorrow"),
			Signal{Status: 429, Refused: true, Quotas: []Quota{{Limit: -1}},
				Unreadable: []Field{{"x-ratelimit-limit", "sixty"}, {"x-ratelimit-reset", "tomorrow"}, {"retry-after", "soon"}}}},
		{"a limit without its remaining is still reported", GitHub,
			resp(200, "x-ratelimit-limit: 5k"),
			Signal{Status: 200, Unreadable: []Field{{"x-ratelimit-limit", "5k"}}}},
		{"an empty value is reported", OpenAI,
			resp(200, "x-ratelimit-remaining-requests:"),
			Signal{Status: 200, Unreadable: []Field{{"x-ratelimit-remaining-requests", ""}}}},
		{"a long value is cut", OpenAI,
			resp(200, "x-ratelimit-remaining-requests: "+long),
			Signal{Status: 200, Unreadable: []Field{{"x-ratelimit-remaining-requests", long[:maxValue]}}}},
		{"Retry-After is not read, nor reported, on a 200", GitHub,
			resp(200, "retry-after: soon"), Signal{Status: 200}},
		{"Sentinel Hub: milliseconds in words", SentinelHub,
			resp(429, "Retry-After: 2s", "X-ProcessingUnits-Remaining: 1,5"),
			Signal{Status: 429, Refused: true, Unreadable: []Field{
				{"X-ProcessingUnits-Remaining", "1,5"}, {"Retry-After", "2s"}}}},
		{"draft 08+: r and t garbled", Default,
			resp(200, `RateLimit-Policy: "default";q=lots;w=60`, `RateLimit: "default";r=five;t=30`, `RateLimit: "b";r=2;t=soon`),
			Signal{Status: 200, Quotas: []Quota{{Policy: "b", Limit: -1, Remaining: 2}},
				Unreadable: []Field{{"RateLimit", `"default";r=five;t=30,"b";r=2;t=soon`}}}},
		{"draft 08+: a garbled policy", Default,
			resp(200, `RateLimit-Policy: "default";q=lots;w=1m`, `RateLimit: "default";r=5`),
			Signal{Status: 200, Quotas: []Quota{{Policy: "default", Limit: -1, Remaining: 5}},
				Unreadable: []Field{{"RateLimit-Policy", `"default";q=lots;w=1m`}}}},
		{"draft 07: reset garbled", Default,
			resp(200, "RateLimit: limit=100, remaining=50, reset=later"),
			Signal{Status: 200, Quotas: []Quota{{Limit: 100, Remaining: 50}},
				Unreadable: []Field{{"RateLimit", "limit=100, remaining=50, reset=later"}}}},
		{"draft 06: every field garbled", Default,
			resp(200, "RateLimit-Limit: ten", "RateLimit-Remaining: nine", "RateLimit-Reset: one"),
			Signal{Status: 200, Unreadable: []Field{
				{"RateLimit-Remaining", "nine"}, {"RateLimit-Reset", "one"}, {"RateLimit-Limit", "ten"}}}},
		{"headers that are absent are not reported", OpenAI,
			resp(429, "x-ratelimit-remaining-requests: 0"),
			Signal{Status: 429, Refused: true, Quotas: []Quota{{Limit: -1, UntilFull: true}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.headers.parseAt(tt.resp, now)
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got  %+v\nwant %+v", got, tt.want)
			}
			check(t, got)
		})
	}
}
