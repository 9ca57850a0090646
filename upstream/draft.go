package upstream

import (
	"net/http"
	"strings"
	"time"
)

// The IETF draft's fields (draft-ietf-httpapi-ratelimit-headers), in the
// three shapes servers send:
//
//	08 and later:  RateLimit-Policy: "burst";q=100;w=60, "day";q=1000;w=86400
//	               RateLimit: "burst";r=50;t=30
//	07:            RateLimit-Policy: 100;w=60
//	               RateLimit: limit=100, remaining=50, reset=30
//	06 and before: RateLimit-Limit: 100, 100;w=60
//	               RateLimit-Remaining: 50
//	               RateLimit-Reset: 30
//
// The reader is lenient (a name may be a token or a quoted string, spaces
// are allowed around separators) and bounded: it reads at most maxItems
// items of a field and maxParams parameters of an item, and skips what it
// cannot read.

const (
	maxItems  = 32
	maxParams = 16
)

// readDraft returns the quotas the draft's fields report, counting unit,
// and notes in r the fields it found with values it cannot read.
func readDraft(r *reading, unit string) []Quota {
	policyField, field := joined(r.hdr, "RateLimit-Policy"), joined(r.hdr, "RateLimit")
	policies, items := sfList(policyField), sfList(field)
	var out []Quota
	if isDictionary(items) {
		if q, ok := readDraft07(r, unit, field, items, policies); ok {
			out = append(out, q)
		}
	} else {
		out = readDraft08(r, unit, field, items, policyField, policies)
	}
	if q, ok := readDraft06(r, unit, policies); ok {
		out = append(out, q)
	}
	return out
}

// isDictionary reports whether the RateLimit field is draft 07's
// dictionary (limit=, remaining=, reset=) rather than a list of items.
func isDictionary(items []sfItem) bool {
	for _, it := range items {
		if strings.Contains(it.bare, "=") {
			return true
		}
	}
	return false
}

// readDraft07 reads draft 07's RateLimit field, one dictionary, into a
// quota, whose window is the RateLimit-Policy item of the same limit.
func readDraft07(r *reading, unit, field string, items, policies []sfItem) (Quota, bool) {
	m := map[string]string{}
	for _, it := range items {
		k, v, _ := strings.Cut(it.bare, "=")
		m[strings.ToLower(strings.TrimSpace(k))] = unquote(strings.TrimSpace(v))
	}
	for _, k := range []struct {
		key  string
		read func(string) bool
	}{{"remaining", isCount}, {"limit", isLimit}, {"reset", r.isReset}} {
		v, ok := m[k.key]
		r.checkField("RateLimit", field, v, ok, k.read)
	}
	rem, ok := count(m["remaining"])
	if !ok {
		return Quota{}, false
	}
	q := Quota{Unit: unit, Limit: -1, Remaining: rem}
	if l, ok := limit(m["limit"]); ok {
		q.Limit = l
		q.Window = windowOf(policies, func(p sfItem) bool { n, ok := count(p.bare); return ok && n == l })
	}
	q.Reset, _ = readReset(m["reset"], false, r.now)
	return q, true
}

// readDraft08 reads the RateLimit items of draft 08 and later, one quota
// each, with the limit and window of the RateLimit-Policy item of the
// same name.
func readDraft08(r *reading, unit, field string, items []sfItem, policyField string, policies []sfItem) []Quota {
	var out []Quota
	for _, it := range items {
		rv, has := it.params["r"]
		tv, hasT := it.params["t"]
		r.checkField("RateLimit", field, tv, hasT, r.isReset)
		rem, ok := count(rv)
		r.checkField("RateLimit", field, rv, has, isCount)
		if !ok {
			continue
		}
		q := Quota{Unit: unit, Policy: it.bare, Limit: -1, Remaining: rem}
		q.Reset, _ = readReset(tv, false, r.now)
		for _, p := range policies {
			if p.bare == it.bare {
				qv, hasQ := p.params["q"]
				wv, hasW := p.params["w"]
				r.checkField("RateLimit-Policy", policyField, qv, hasQ, isLimit)
				r.checkField("RateLimit-Policy", policyField, wv, hasW, isWindow)
				q.Limit, _ = limit(qv)
				q.Window = window(wv)
				break
			}
		}
		out = append(out, q)
	}
	return out
}

// readDraft06 reads the fields of drafts 06 and before (RateLimit-Limit,
// -Remaining, -Reset) into a quota, whose window is the limit's own w=,
// else that of the RateLimit-Policy item of the same limit.
func readDraft06(r *reading, unit string, policies []sfItem) (Quota, bool) {
	hdr := r.hdr
	v, present := r.get("RateLimit-Remaining")
	r.checkField("RateLimit-Remaining", v, v, present, isCount)
	reset, hasReset := r.get("RateLimit-Reset")
	r.checkField("RateLimit-Reset", reset, reset, hasReset, r.isReset)
	limits := sfList(hdr.Get("RateLimit-Limit"))
	if len(limits) > 0 {
		r.checkField("RateLimit-Limit", hdr.Get("RateLimit-Limit"), limits[0].bare, true, isLimit)
	}
	rem, ok := count(v)
	if !ok {
		return Quota{}, false
	}
	q := Quota{Unit: unit, Limit: -1, Remaining: rem}
	if len(limits) > 0 {
		if l, ok := limit(limits[0].bare); ok {
			q.Limit = l
			same := func(p sfItem) bool { n, ok := count(p.bare); return ok && n == l }
			q.Window = windowOf(limits, same)
			if q.Window == 0 {
				q.Window = windowOf(policies, same)
			}
		}
	}
	q.Reset, _ = readReset(reset, false, r.now)
	return q, true
}

// checkField notes in r that the value v of the field name (whole, as
// sent) cannot be read; an absent value (!present) is fine.
func (r *reading) checkField(name, whole, v string, present bool, read func(string) bool) {
	if present && !read(v) {
		r.unreadable(name, whole)
	}
}

// isCount reports whether v reads as a remaining count.
func isCount(v string) bool { _, ok := count(v); return ok }

// isLimit reports whether v reads as a limit.
func isLimit(v string) bool { _, ok := limit(v); return ok }

// isWindow reports whether v reads as a policy's window (w=), in seconds.
func isWindow(v string) bool { _, ok := decimal(strings.TrimSpace(v)); return ok }

// isReset reports whether v reads as a reset, a wait in seconds or an
// instant.
func (r *reading) isReset(v string) bool { _, ok := readReset(v, false, r.now); return ok }

// joined is every value of the field name, as one list.
func joined(hdr http.Header, name string) string {
	return strings.Join(hdr.Values(name), ",")
}

// windowOf is the w= of the first item that matches and has one.
func windowOf(items []sfItem, match func(sfItem) bool) time.Duration {
	for _, p := range items {
		if _, ok := p.params["w"]; ok && match(p) {
			return window(p.params["w"])
		}
	}
	return 0
}

// window reads a w= parameter: seconds, within [0, maxWindow].
func window(v string) time.Duration {
	f, ok := decimal(strings.TrimSpace(v))
	if !ok {
		return 0
	}
	return scaled(f, time.Second, maxWindow)
}

// sfItem is one member of a list: its bare item (unquoted) and its
// parameters (keys lowercased, values unquoted).
type sfItem struct {
	bare   string
	params map[string]string
}

// sfList splits a structured-field-like list into items.
func sfList(v string) []sfItem {
	var out []sfItem
	for _, member := range split(v, ',') {
		if len(out) == maxItems {
			break
		}
		parts := split(member, ';')
		if len(parts) == 0 {
			continue
		}
		it := sfItem{bare: unquote(strings.TrimSpace(parts[0]))}
		if it.bare == "" {
			continue
		}
		for i, p := range parts[1:] {
			if i == maxParams {
				break
			}
			k, val, _ := strings.Cut(p, "=")
			k = strings.ToLower(strings.TrimSpace(k))
			if k == "" {
				continue
			}
			if it.params == nil {
				it.params = map[string]string{}
			}
			if _, dup := it.params[k]; !dup {
				it.params[k] = unquote(strings.TrimSpace(val))
			}
		}
		out = append(out, it)
	}
	return out
}

// split cuts s at every sep outside a quoted string.
func split(s string, sep byte) []string {
	var out []string
	quoted, escaped, start := false, false, 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case escaped:
			escaped = false
		case quoted && c == '\\':
			escaped = true
		case c == '"':
			quoted = !quoted
		case c == sep && !quoted:
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// unquote strips a quoted string's quotes and escapes; anything else is
// returned as it is.
func unquote(s string) string {
	if len(s) < 2 || s[0] != '"' || s[len(s)-1] != '"' {
		return s
	}
	s = s[1 : len(s)-1]
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) {
			i++
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
