package upstream

import (
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Caps on what Parse reads (see the package comment).
const (
	maxDelay  = 24 * time.Hour       // a Retry-After or a reset
	maxWindow = 366 * 24 * time.Hour // a policy's window
	maxCount  = 1 << 53              // a limit or a remaining count
	// epochSeconds: a reset in seconds above it is a Unix time, not a
	// wait. 10^9 seconds is 31 years (a wait nobody sends) and the Unix
	// time of September 2001 (a reset nobody sends any more).
	epochSeconds = 1e9
)

// Headers says which response headers Parse reads, and in which units. The
// zero value reads nothing. Default and SentinelHub are ready-made sets; copy
// one and change it for another API.
type Headers struct {
	// RetryAfter are the headers that say how long to wait, read on 429,
	// 503 and 403 answers. The longest wait among them wins.
	RetryAfter []Delay
	// Counters are the families of headers, each reporting one quota, in
	// the style of X-RateLimit-Limit / -Remaining / -Reset.
	Counters []Counter
	// Draft reads the IETF draft's fields (draft-ietf-httpapi-ratelimit-
	// headers): RateLimit and RateLimit-Policy, in the structured form
	// (`RateLimit: "default";r=50;t=30`, `RateLimit-Policy:
	// "default";q=100;w=60`) and in draft 07's (`RateLimit: limit=100,
	// remaining=50, reset=30`), and the older RateLimit-Limit,
	// RateLimit-Remaining and RateLimit-Reset. Their quotas count
	// DraftUnit.
	Draft     bool
	DraftUnit string
}

// Delay is a header saying how long to wait: a number of seconds (of
// milliseconds when Millis is set), or an HTTP-date (any of the three
// formats http.ParseTime reads), taken relative to the response's Date
// header when it has a valid one, else to the time of Parse.
type Delay struct {
	Name   string
	Millis bool
}

// Counter is a family of headers reporting one quota counting Unit. Each
// name may be "" when the upstream does not send that header; a Counter
// yields a Quota only when its Remaining header is present and valid.
//
// Reset is a wait or an instant, told apart by size: in seconds, a value
// above 10^9 is a Unix time (GitHub, X, Discord send those), anything lower
// a number of seconds to wait (Reddit, most gateways); with Millis, a value
// above 10^12 is a Unix time in milliseconds, lower a number of
// milliseconds. A Unix time is taken relative to the response's Date header
// when it has one (the upstream's clock, to the second: the wait read is up
// to a second long, never short), else to the local clock. A reset may also
// be a Go-style duration ("1m30s", "250ms", as OpenAI sends) or an
// HTTP-date. Numbers may have a fractional part ("1470173023.123").
type Counter struct {
	Unit      string
	Limit     string
	Remaining string
	Reset     string
	Millis    bool
}

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

// Parse reads resp's status and headers with the Default set. It never
// reads or closes the body.
func Parse(resp *http.Response) Signal {
	return Default.Parse(resp)
}

// Parse reads resp's status and the headers h names. It never reads or
// closes the body. A nil resp gives the zero Signal.
func (h Headers) Parse(resp *http.Response) Signal {
	return h.parseAt(resp, time.Now())
}

// parseAt is Parse with the local clock read at now.
func (h Headers) parseAt(resp *http.Response, now time.Time) Signal {
	if resp == nil {
		return Signal{}
	}
	s := Signal{Status: resp.StatusCode}
	hdr := resp.Header
	if d, err := http.ParseTime(hdr.Get("Date")); err == nil {
		now = d
	}
	for _, c := range h.Counters {
		if q, ok := c.read(hdr, now); ok {
			s.Quotas = append(s.Quotas, q)
		}
	}
	if h.Draft {
		s.Quotas = append(s.Quotas, readDraft(hdr, h.DraftUnit, now)...)
	}
	said := false
	switch s.Status {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable, http.StatusForbidden:
		for _, d := range h.RetryAfter {
			if v, ok := readDelay(hdr.Get(d.Name), d.Millis, now); ok {
				said = true
				s.RetryAfter = max(s.RetryAfter, v)
			}
		}
	}
	switch s.Status {
	case http.StatusTooManyRequests:
		s.Refused = true
	case http.StatusServiceUnavailable:
		s.Refused = said
	case http.StatusForbidden:
		s.Refused = said || exhausted(s.Quotas)
	}
	return s
}

func exhausted(qs []Quota) bool {
	for _, q := range qs {
		if q.Remaining == 0 {
			return true
		}
	}
	return false
}

func (c Counter) read(hdr http.Header, now time.Time) (Quota, bool) {
	if c.Remaining == "" {
		return Quota{}, false
	}
	rem, ok := count(hdr.Get(c.Remaining))
	if !ok {
		return Quota{}, false
	}
	q := Quota{Unit: c.Unit, Limit: -1, Remaining: rem}
	if c.Limit != "" {
		q.Limit = limit(hdr.Get(c.Limit))
	}
	if c.Reset != "" {
		q.Reset, _ = readReset(hdr.Get(c.Reset), c.Millis, now)
	}
	return q, true
}

// readDelay reads a Retry-After value: a number of seconds (milliseconds)
// or an HTTP-date.
func readDelay(v string, millis bool, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if f, ok := decimal(v); ok {
		return scaled(f, unit(millis), maxDelay), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return until(t, now), true
	}
	return 0, false
}

// readReset reads a reset: a wait or a Unix time (told apart by size), a
// Go duration, or an HTTP-date.
func readReset(v string, millis bool, now time.Time) (time.Duration, bool) {
	v = strings.TrimSpace(v)
	if v == "" {
		return 0, false
	}
	if f, ok := decimal(v); ok {
		epoch := float64(epochSeconds)
		if millis {
			epoch *= 1000
		}
		if f <= epoch {
			return scaled(f, unit(millis), maxDelay), true
		}
		return until(unixTime(v, millis), now), true
	}
	if d, err := time.ParseDuration(v); err == nil {
		return clamp(d, maxDelay), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return until(t, now), true
	}
	return 0, false
}

// unixTime reads v, a number decimal accepted and above the epoch
// threshold, as a Unix time in seconds (milliseconds). The integer and the
// fractional parts are read apart: a float64 would lose the milliseconds of
// "1470173023.123".
func unixTime(v string, millis bool) time.Time {
	v = strings.TrimPrefix(v, "+")
	whole, frac, _ := strings.Cut(v, ".")
	n, err := strconv.ParseInt(whole, 10, 64)
	if err != nil || n > 1e15 { // beyond any date time.Time adds safely
		return time.Unix(1e15, 0)
	}
	// The fraction, in billionths of the unit: frac is 9 digits or fewer.
	f, _ := strconv.ParseInt((frac + "000000000")[:9], 10, 64)
	if millis {
		return time.UnixMilli(n).Add(time.Duration(f) * time.Millisecond / time.Second)
	}
	return time.Unix(n, f)
}

func unit(millis bool) time.Duration {
	if millis {
		return time.Millisecond
	}
	return time.Second
}

// until is the wait from now to t, within [0, maxDelay].
func until(t, now time.Time) time.Duration {
	if !t.After(now) {
		return 0
	}
	if t.After(now.Add(maxDelay)) {
		return maxDelay
	}
	return t.Sub(now)
}

// scaled is f units, within [0, limit].
func scaled(f float64, u, limit time.Duration) time.Duration {
	d := f * float64(u)
	switch {
	case !(d > 0): // also NaN, though decimal never yields it
		return 0
	case d >= float64(limit):
		return limit
	}
	return time.Duration(d)
}

func clamp(d, limit time.Duration) time.Duration {
	return min(max(d, 0), limit)
}

// count reads a count: a decimal number, rounded down, within
// [0, maxCount]; a negative one reads as 0.
func count(v string) (int64, bool) {
	f, ok := decimal(strings.TrimSpace(v))
	if !ok {
		return 0, false
	}
	switch {
	case f <= 0:
		return 0, true
	case f >= maxCount:
		return maxCount, true
	}
	return int64(f), true
}

// limit reads a quota's size as count does; -1 when v is not a count or is
// negative.
func limit(v string) int64 {
	f, ok := decimal(strings.TrimSpace(v))
	if !ok || f < 0 {
		return -1
	}
	n, _ := count(v)
	return n
}

// decimal reads an optionally signed decimal number with an optional
// fractional part: no exponent, no hex, no Inf or NaN, no underscores, at
// most 40 characters.
func decimal(v string) (float64, bool) {
	if v == "" || len(v) > 40 {
		return 0, false
	}
	digits, dot := 0, false
	for i := 0; i < len(v); i++ {
		switch c := v[i]; {
		case c >= '0' && c <= '9':
			digits++
		case c == '.' && !dot:
			dot = true
		case (c == '-' || c == '+') && i == 0:
		default:
			return 0, false
		}
	}
	if digits == 0 {
		return 0, false
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		return 0, false
	}
	return f, true
}
