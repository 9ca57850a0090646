package upstream

import (
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"
)

// now is the local clock in these tests; date is the same instant as the
// upstream's Date header.
var (
	now  = time.Date(2025, 3, 14, 15, 9, 26, 0, time.UTC)
	date = now.Format(http.TimeFormat)
)

// resp builds a response from "Name: value" lines.
func resp(status int, lines ...string) *http.Response {
	h := http.Header{}
	for _, l := range lines {
		k, v, _ := strings.Cut(l, ":")
		h.Add(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	return &http.Response{StatusCode: status, Header: h}
}

func calls(limit, remaining int64, reset time.Duration) Quota {
	return Quota{Limit: limit, Remaining: remaining, Reset: reset}
}

func TestParse(t *testing.T) {
	tests := []struct {
		name    string
		headers Headers
		resp    *http.Response
		want    Signal
	}{
		{"nil response", Default, nil, Signal{}},
		{"plain 200", Default, resp(200), Signal{Status: 200}},
		{"429 without Retry-After", Default, resp(429), Signal{Status: 429, Refused: true}},
		{"Retry-After seconds", Default, resp(429, "Retry-After: 2"),
			Signal{Status: 429, Refused: true, RetryAfter: 2 * time.Second}},
		{"Retry-After with spaces and a fraction", Default, resp(429, "Retry-After:  1.5 "),
			Signal{Status: 429, Refused: true, RetryAfter: 1500 * time.Millisecond}},
		{"Retry-After HTTP-date against Date", Default,
			resp(429, "Date: "+date, "Retry-After: "+now.Add(90*time.Second).Format(http.TimeFormat)),
			Signal{Status: 429, Refused: true, RetryAfter: 90 * time.Second}},
		{"Retry-After RFC 850 date", Default,
			resp(503, "Date: "+date, "Retry-After: "+now.Add(time.Minute).Format(time.RFC850)),
			Signal{Status: 503, Refused: true, RetryAfter: time.Minute}},
		{"Retry-After ANSI C date against the local clock", Default,
			resp(503, "Retry-After: "+now.Add(5*time.Second).Format(time.ANSIC)),
			Signal{Status: 503, Refused: true, RetryAfter: 5 * time.Second}},
		{"Retry-After date in the past", Default,
			resp(429, "Date: "+date, "Retry-After: "+now.Add(-time.Hour).Format(http.TimeFormat)),
			Signal{Status: 429, Refused: true}},
		{"Retry-After negative", Default, resp(429, "Retry-After: -5"), Signal{Status: 429, Refused: true}},
		{"Retry-After garbage", Default, resp(429, "Retry-After: soon"),
			Signal{Status: 429, Refused: true, Unreadable: []Field{{"Retry-After", "soon"}}}},
		{"Retry-After exponent is garbage", Default, resp(429, "Retry-After: 1e3"),
			Signal{Status: 429, Refused: true, Unreadable: []Field{{"Retry-After", "1e3"}}}},
		{"Retry-After capped at 24 h", Default, resp(429, "Retry-After: 99999999999999999999"),
			Signal{Status: 429, Refused: true, RetryAfter: 24 * time.Hour}},
		{"503 without Retry-After is not a refusal", Default, resp(503), Signal{Status: 503}},
		{"503 with Retry-After 0 is a refusal", Default, resp(503, "Retry-After: 0"), Signal{Status: 503, Refused: true}},
		{"Retry-After on a redirect is ignored", Default, resp(301, "Retry-After: 10"), Signal{Status: 301}},
		{"Retry-After on a 200 is ignored", Default, resp(200, "Retry-After: 10"), Signal{Status: 200}},

		{"GitHub: epoch reset against Date", Default,
			resp(200, "Date: "+date, "X-RateLimit-Limit: 5000", "X-RateLimit-Remaining: 4999",
				"X-RateLimit-Used: 1", "X-RateLimit-Resource: core",
				"X-RateLimit-Reset: "+itoa(now.Unix()+3600)),
			Signal{Status: 200, Quotas: []Quota{calls(5000, 4999, time.Hour)}}},
		{"GitHub: primary limit is a 403 with remaining 0", Default,
			resp(403, "Date: "+date, "X-RateLimit-Limit: 60", "X-RateLimit-Remaining: 0",
				"X-RateLimit-Reset: "+itoa(now.Unix()+1800)),
			Signal{Status: 403, Refused: true, Quotas: []Quota{calls(60, 0, 30*time.Minute)}}},
		{"403 with quota left is not a refusal", Default,
			resp(403, "X-RateLimit-Remaining: 10"),
			Signal{Status: 403, Quotas: []Quota{calls(-1, 10, 0)}}},
		{"403 with Retry-After (GitHub's secondary limit)", Default, resp(403, "Retry-After: 60"),
			Signal{Status: 403, Refused: true, RetryAfter: time.Minute}},
		{"epoch reset in the past", Default,
			resp(200, "Date: "+date, "X-RateLimit-Remaining: 3", "X-RateLimit-Reset: "+itoa(now.Unix()-10)),
			Signal{Status: 200, Quotas: []Quota{calls(-1, 3, 0)}}},
		{"epoch reset beyond 24 h is capped", Default,
			resp(200, "Date: "+date, "X-RateLimit-Remaining: 3", "X-RateLimit-Reset: "+itoa(now.Unix()+86400*40)),
			Signal{Status: 200, Quotas: []Quota{calls(-1, 3, 24*time.Hour)}}},
		{"Discord: fractional epoch reset", Default,
			resp(429, "Date: "+date, "X-RateLimit-Limit: 5", "X-RateLimit-Remaining: 0",
				"X-RateLimit-Reset: "+itoa(now.Unix()+2)+".250", "X-RateLimit-Reset-After: 2.250",
				"Retry-After: 3"),
			Signal{Status: 429, Refused: true, RetryAfter: 3 * time.Second,
				Quotas: []Quota{calls(5, 0, 2250*time.Millisecond)}}},
		{"X (Twitter) spelling", Default,
			resp(429, "Date: "+date, "X-Rate-Limit-Limit: 900", "X-Rate-Limit-Remaining: 0",
				"X-Rate-Limit-Reset: "+itoa(now.Unix()+600)),
			Signal{Status: 429, Refused: true, Quotas: []Quota{calls(900, 0, 10*time.Minute)}}},
		{"Reddit: seconds until reset, fractional remaining", Default,
			resp(200, "X-RateLimit-Remaining: 99.0", "X-RateLimit-Used: 1", "X-RateLimit-Reset: 540"),
			Signal{Status: 200, Quotas: []Quota{calls(-1, 99, 9*time.Minute)}}},
		{"OpenAI-style duration reset", Headers{Counters: []Counter{{
			Limit: "X-RateLimit-Limit-Requests", Remaining: "X-RateLimit-Remaining-Requests", Reset: "X-RateLimit-Reset-Requests"}}},
			resp(200, "X-RateLimit-Limit-Requests: 60", "X-RateLimit-Remaining-Requests: 59", "X-RateLimit-Reset-Requests: 1s"),
			Signal{Status: 200, Quotas: []Quota{calls(60, 59, time.Second)}}},
		{"reset as an HTTP-date", Default,
			resp(200, "Date: "+date, "X-RateLimit-Remaining: 1", "X-RateLimit-Reset: "+now.Add(time.Minute).Format(http.TimeFormat)),
			Signal{Status: 200, Quotas: []Quota{calls(-1, 1, time.Minute)}}},
		{"reset garbage is unknown and reported, the quota stays", Default,
			resp(200, "X-RateLimit-Remaining: 7", "X-RateLimit-Reset: Tue Feb 16 2021 09:02:42 GMT+0100 (CET)"),
			Signal{Status: 200, Quotas: []Quota{calls(-1, 7, 0)},
				Unreadable: []Field{{"X-RateLimit-Reset", "Tue Feb 16 2021 09:02:42 GMT+0100 (CET)"}}}},
		{"reset as an RFC 3339 timestamp", Default,
			resp(200, "Date: "+date, "X-RateLimit-Remaining: 7", "X-RateLimit-Reset: 2025-03-14T15:10:26Z"),
			Signal{Status: 200, Quotas: []Quota{calls(-1, 7, time.Minute)}}},
		{"negative remaining reads 0, negative limit unknown and reported", Default,
			resp(200, "X-RateLimit-Limit: -4", "X-RateLimit-Remaining: -3"),
			Signal{Status: 200, Quotas: []Quota{calls(-1, 0, 0)}, Unreadable: []Field{{"X-RateLimit-Limit", "-4"}}}},
		{"huge remaining is capped", Default,
			resp(200, "X-RateLimit-Remaining: 123456789012345678901234567890"),
			Signal{Status: 200, Quotas: []Quota{calls(-1, maxCount, 0)}}},
		{"remaining garbage: no quota, reported", Default,
			resp(200, "X-RateLimit-Limit: 10", "X-RateLimit-Remaining: lots"),
			Signal{Status: 200, Unreadable: []Field{{"X-RateLimit-Remaining", "lots"}}}},
		{"limit without remaining: no quota", Default, resp(200, "X-RateLimit-Limit: 10"), Signal{Status: 200}},

		{"milliseconds: Prisjakt-style reset", Headers{Counters: []Counter{{
			Limit: "X-Rate-Limit-Limit", Remaining: "X-Rate-Limit-Remaining", Reset: "X-Rate-Limit-Reset", Millis: true}}},
			resp(200, "X-Rate-Limit-Limit: 10000", "X-Rate-Limit-Remaining: 0", "X-Rate-Limit-Reset: 600000"),
			Signal{Status: 200, Quotas: []Quota{calls(10000, 0, 10*time.Minute)}}},
		{"milliseconds: epoch reset", Headers{Counters: []Counter{{Remaining: "R", Reset: "T", Millis: true}}},
			resp(200, "Date: "+date, "R: 4", "T: "+itoa(now.UnixMilli()+1500)),
			Signal{Status: 200, Quotas: []Quota{calls(-1, 4, 1500*time.Millisecond)}}},

		{"Sentinel Hub: 429 on requests", SentinelHub,
			resp(429, "Retry-After: 2313", "X-RateLimit-Remaining: 0", "X-ProcessingUnits-Remaining: 183.4"),
			Signal{Status: 429, Refused: true, RetryAfter: 2313 * time.Millisecond, Quotas: []Quota{
				calls(-1, 0, 0), {Unit: "pu", Limit: -1, Remaining: 183}}}},
		{"Sentinel Hub: 429 on processing units, the longer wait wins", SentinelHub,
			resp(429, "Retry-After: 100", "X-ProcessingUnits-Retry-After: 12000", "X-RateLimit-ViolatedPolicy: PROCESSING_UNITS"),
			Signal{Status: 429, Refused: true, RetryAfter: 12 * time.Second}},
		{"Sentinel Hub: 200", SentinelHub,
			resp(200, "X-RateLimit-Remaining: 299", "X-ProcessingUnits-Remaining: 29954.66"),
			Signal{Status: 200, Quotas: []Quota{calls(-1, 299, 0), {Unit: "pu", Limit: -1, Remaining: 29954}}}},
		{"Sentinel Hub set ignores the draft fields", SentinelHub,
			resp(200, `RateLimit: "default";r=5;t=1`), Signal{Status: 200}},

		{"draft 08+: one policy", Default,
			resp(200, `RateLimit-Policy: "default";q=100;w=60`, `RateLimit: "default";r=50;t=30`),
			Signal{Status: 200, Quotas: []Quota{{Policy: "default", Limit: 100, Remaining: 50, Reset: 30 * time.Second, Window: time.Minute}}}},
		{"draft 08+: two policies, tokens, spaces, a partition key", Default,
			resp(429, `RateLimit-Policy: burst;q=100;w=60, "day";q=1000;w=86400;qu="requests"`,
				`RateLimit: "day";r=0;t=3600;pk=:cHJvamVjdDEyMw==:, burst ; r=12 ; t=5`),
			Signal{Status: 429, Refused: true, Quotas: []Quota{
				{Policy: "day", Limit: 1000, Remaining: 0, Reset: time.Hour, Window: 24 * time.Hour},
				{Policy: "burst", Limit: 100, Remaining: 12, Reset: 5 * time.Second, Window: time.Minute}}}},
		{"draft 08+: RateLimit over two field lines", Default,
			resp(200, `RateLimit: "a";r=1`, `RateLimit: "b";r=2;t=2`),
			Signal{Status: 200, Quotas: []Quota{
				{Policy: "a", Limit: -1, Remaining: 1}, {Policy: "b", Limit: -1, Remaining: 2, Reset: 2 * time.Second}}}},
		{"draft 08+: a policy with no RateLimit item yields nothing", Default,
			resp(200, `RateLimit-Policy: "default";q=100;w=60`), Signal{Status: 200}},
		{"draft 08+: item without r= is skipped", Default,
			resp(200, `RateLimit: "default";t=30`), Signal{Status: 200}},
		{"draft 08+: draft unit", Headers{Draft: true, DraftUnit: "tokens"},
			resp(200, `RateLimit: "tpm";r=9000;t=12`),
			Signal{Status: 200, Quotas: []Quota{{Unit: "tokens", Policy: "tpm", Limit: -1, Remaining: 9000, Reset: 12 * time.Second}}}},
		{"draft 07: dictionary", Default,
			resp(200, "RateLimit-Policy: 100;w=60, 10000;w=86400", "RateLimit: limit=100, remaining=50, reset=30"),
			Signal{Status: 200, Quotas: []Quota{{Limit: 100, Remaining: 50, Reset: 30 * time.Second, Window: time.Minute}}}},
		{"draft 07: the larger policy", Default,
			resp(200, "RateLimit-Policy: 100;w=60, 10000;w=86400", "RateLimit: limit=10000, remaining=90, reset=200"),
			Signal{Status: 200, Quotas: []Quota{{Limit: 10000, Remaining: 90, Reset: 200 * time.Second, Window: 24 * time.Hour}}}},
		{"draft 06: RateLimit-Limit with its policy", Default,
			resp(200, "RateLimit-Limit: 10, 10;w=1, 1000;w=3600", "RateLimit-Remaining: 9", "RateLimit-Reset: 1"),
			Signal{Status: 200, Quotas: []Quota{{Limit: 10, Remaining: 9, Reset: time.Second, Window: time.Second}}}},
		{"draft 06: plain limit, policy in RateLimit-Policy", Default,
			resp(429, "RateLimit-Limit: 100", "RateLimit-Remaining: 0", "RateLimit-Reset: 48", "RateLimit-Policy: 100;w=60", "Retry-After: 48"),
			Signal{Status: 429, Refused: true, RetryAfter: 48 * time.Second,
				Quotas: []Quota{{Limit: 100, Remaining: 0, Reset: 48 * time.Second, Window: time.Minute}}}},
		{"draft: window capped at 366 days", Default,
			resp(200, `RateLimit-Policy: "y";q=1;w=999999999999`, `RateLimit: "y";r=1`),
			Signal{Status: 200, Quotas: []Quota{{Policy: "y", Limit: 1, Remaining: 1, Window: 366 * 24 * time.Hour}}}},
		{"draft: unterminated quote", Default,
			resp(200, `RateLimit: "default;r=5`), Signal{Status: 200}},
		{"both families at once", Default,
			resp(200, "X-RateLimit-Remaining: 4", `RateLimit: "d";r=3`),
			Signal{Status: 200, Quotas: []Quota{calls(-1, 4, 0), {Policy: "d", Limit: -1, Remaining: 3}}}},
		{"zero Headers reads nothing", Headers{}, resp(429, "Retry-After: 3", "X-RateLimit-Remaining: 0"),
			Signal{Status: 429, Refused: true}},
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

// TestParseNow: without a Date header, dates are taken against the local
// clock; Parse reads the real one.
func TestParseNow(t *testing.T) {
	r := resp(429, "Retry-After: "+time.Now().Add(time.Hour).Format(http.TimeFormat))
	got := Parse(r)
	if got.RetryAfter < 58*time.Minute || got.RetryAfter > time.Hour {
		t.Errorf("Retry-After an hour from now read as %v", got.RetryAfter)
	}
}

// check fails t if s breaks the promises every Signal keeps.
func check(t *testing.T, s Signal) {
	t.Helper()
	if s.RetryAfter < 0 || s.RetryAfter > maxDelay {
		t.Errorf("RetryAfter %v out of [0, %v]", s.RetryAfter, maxDelay)
	}
	switch s.Status {
	case 429, 503, 403:
	default:
		if s.Refused || s.RetryAfter != 0 {
			t.Errorf("status %d read as Refused %v, RetryAfter %v", s.Status, s.Refused, s.RetryAfter)
		}
	}
	for _, f := range s.Unreadable {
		if f.Name == "" || len(f.Value) > maxValue {
			t.Errorf("unreadable header out of range: %+v", f)
		}
	}
	for _, q := range s.Quotas {
		if q.Remaining < 0 || q.Remaining > maxCount || q.Limit < -1 || q.Limit > maxCount ||
			q.Reset < 0 || q.Reset > maxDelay || q.Window < 0 || q.Window > maxWindow {
			t.Errorf("quota out of range: %+v", q)
		}
	}
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
