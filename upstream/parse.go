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
// zero value reads nothing. Default, OpenAI, Anthropic, GitHub and
// SentinelHub are ready-made sets; copy one and change it for another API.
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
// be a Go-style duration ("1m30s", "250ms", as OpenAI sends), an RFC 3339
// timestamp ("2024-06-21T17:34:00Z", as Anthropic sends, taken as a Unix
// time is) or an HTTP-date. Numbers may have a fractional part
// ("1470173023.123").
//
// Policy, when set, is the header whose value names the quota
// (Quota.Policy), such as GitHub's X-RateLimit-Resource. UntilFull says
// that the upstream's reset is the time until the quota is full again at
// its steady rate, not a window's end (Quota.UntilFull).
//
// Window, when set, is the quota's window where the headers do not say
// it (Quota.Window): a bucket that receives the quota (bucket.Sync,
// Feedback) lowers the level of its policy of that unit whose time to fill
// is nearest to it, not of the one that fills fastest. Sentinel Hub's
// X-ProcessingUnits-Remaining says what is left of the account's processing
// units, with no limit or window: a Counter with Window 30 days steers it
// to a bucket's monthly policy.
type Counter struct {
	Unit      string
	Limit     string
	Remaining string
	Reset     string
	Policy    string
	Millis    bool
	UntilFull bool
	Window    time.Duration
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
	if d, err := http.ParseTime(resp.Header.Get("Date")); err == nil {
		now = d
	}
	r := &reading{hdr: resp.Header, now: now}
	for _, c := range h.Counters {
		if q, ok := c.read(r); ok {
			s.Quotas = append(s.Quotas, q)
		}
	}
	if h.Draft {
		s.Quotas = append(s.Quotas, readDraft(r, h.DraftUnit)...)
	}
	said := false
	switch s.Status {
	case http.StatusTooManyRequests, http.StatusServiceUnavailable, http.StatusForbidden:
		for _, d := range h.RetryAfter {
			v, ok := r.get(d.Name)
			if !ok {
				continue
			}
			if w, ok := readDelay(v, d.Millis, now); ok {
				said = true
				s.RetryAfter = max(s.RetryAfter, w)
			} else {
				r.unreadable(d.Name, v)
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
	s.Unreadable = r.bad
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

// maxValue is how much of an unreadable header's value a Field keeps.
const maxValue = 128

// reading is one response being read: its headers, the instant its dates
// are taken against, and the headers found unreadable so far.
type reading struct {
	hdr http.Header
	now time.Time
	bad []Field
}

// get is the first value of the header name, and whether the response
// has it at all ("" names none).
func (r *reading) get(name string) (string, bool) {
	if name == "" {
		return "", false
	}
	vs := r.hdr.Values(name)
	if len(vs) == 0 {
		return "", false
	}
	return vs[0], true
}

// unreadable notes that the header name has the value v, which cannot be
// read; a header is noted once.
func (r *reading) unreadable(name, v string) {
	for _, f := range r.bad {
		if strings.EqualFold(f.Name, name) {
			return
		}
	}
	if len(v) > maxValue {
		v = v[:maxValue]
	}
	r.bad = append(r.bad, Field{Name: name, Value: v})
}

func (c Counter) read(r *reading) (Quota, bool) {
	q := Quota{Unit: c.Unit, Limit: -1, UntilFull: c.UntilFull, Window: c.Window}
	if v, ok := r.get(c.Limit); ok {
		if n, ok := limit(v); ok {
			q.Limit = n
		} else {
			r.unreadable(c.Limit, v)
		}
	}
	v, present := r.get(c.Remaining)
	rem, ok := count(v)
	if present && !ok {
		r.unreadable(c.Remaining, v)
	}
	if v, ok := r.get(c.Reset); ok {
		if d, ok := readReset(v, c.Millis, r.now); ok {
			q.Reset = d
		} else {
			r.unreadable(c.Reset, v)
		}
	}
	if v, ok := r.get(c.Policy); ok {
		q.Policy = strings.TrimSpace(v)
	}
	if !present || !ok {
		return Quota{}, false
	}
	q.Remaining = rem
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
// Go duration, an RFC 3339 timestamp, or an HTTP-date.
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
	if t, err := time.Parse(time.RFC3339, v); err == nil {
		return until(t, now), true
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

// limit reads a quota's size as count does; false when v is not a count
// or is negative.
func limit(v string) (int64, bool) {
	f, ok := decimal(strings.TrimSpace(v))
	if !ok || f < 0 {
		return -1, false
	}
	n, _ := count(v)
	return n, true
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
