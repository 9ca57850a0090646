package main

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/bucket"
)

// Policies as the commands show and read them.

// policyJSON is one policy in --json output; the names are stable.
type policyJSON struct {
	Unit          string  `json:"unit"` // "" counts calls
	Capacity      int     `json:"capacity"`
	RefillAmount  int     `json:"refill_amount"`
	RefillEveryUS int64   `json:"refill_every_us"`
	RatePerSecond float64 `json:"rate_per_second"`
	// Kind is "fixed" or "rolling" for a window (its capacity per
	// refill_every_us), absent for a token bucket.
	Kind string `json:"kind,omitempty"`
}

func toJSON(p bucket.Policy) policyJSON {
	return policyJSON{
		Unit:          p.Unit,
		Capacity:      p.Capacity,
		RefillAmount:  p.RefillAmount,
		RefillEveryUS: p.RefillFrequency.Microseconds(),
		RatePerSecond: perSecond(p),
		Kind:          kindName(p.Kind),
	}
}

// kindName is a policy's kind as --policy and --json write it.
func kindName(k bucket.Kind) string {
	switch k {
	case bucket.FixedWindow:
		return "fixed"
	case bucket.RollingWindow:
		return "rolling"
	}
	return ""
}

// kindOf reads kindName back.
func kindOf(s string) bucket.Kind {
	switch s {
	case "fixed":
		return bucket.FixedWindow
	case "rolling":
		return bucket.RollingWindow
	}
	return bucket.TokenBucket
}

// unitName is a policy's unit as a person reads it.
func unitName(u string) string {
	if u == "" {
		return "calls"
	}
	return u
}

// refill is "1 every 5ms", or a window's "20 in any 1s", "5000 each 1h0m0s".
func refill(p bucket.Policy) string {
	switch p.Kind {
	case bucket.RollingWindow:
		return fmt.Sprintf("%d in any %v", p.Capacity, p.RefillFrequency)
	case bucket.FixedWindow:
		return fmt.Sprintf("%d each %v", p.Capacity, p.RefillFrequency)
	}
	return fmt.Sprintf("%d every %v", p.RefillAmount, p.RefillFrequency)
}

func perSecond(p bucket.Policy) float64 {
	if p.RefillFrequency <= 0 {
		return 0
	}
	return float64(p.RefillAmount) / p.RefillFrequency.Seconds()
}

// rate is the rate p makes in the smallest period where it is a whole
// number ("200/s", "1000/min"), else in the smallest where it is at least
// one, to three significant digits ("8.96/min").
func rate(p bucket.Policy) string {
	periods := []struct {
		name string
		secs float64
	}{{"s", 1}, {"min", 60}, {"h", 3600}, {"day", 86400}}
	r := perSecond(p)
	for _, per := range periods {
		v := r * per.secs
		if v >= 1 && math.Abs(v-math.Round(v)) < 1e-9*v {
			return fmt.Sprintf("%d/%s", int64(math.Round(v)), per.name)
		}
	}
	for _, per := range periods {
		if v := r * per.secs; v >= 1 {
			return strconv.FormatFloat(v, 'g', 3, 64) + "/" + per.name
		}
	}
	return strconv.FormatFloat(r*86400, 'g', 3, 64) + "/day"
}

// summary is one policy on a line: "calls: capacity 50, 1 every 5ms (200/s)".
func summary(p bucket.Policy) string {
	return fmt.Sprintf("%s: capacity %d, %s (%s)", unitName(p.Unit), p.Capacity, refill(p), rate(p))
}

// parseRate reads "N/PERIOD": 200/1s, 200/s, 1000/1m, 1000/min.
func parseRate(s string) (n int, period time.Duration, err error) {
	ns, ps, ok := strings.Cut(s, "/")
	if !ok {
		return 0, 0, fmt.Errorf("rate %q: want N/PERIOD, such as 200/1s or 1000/1m", s)
	}
	n, err = strconv.Atoi(strings.TrimSpace(ns))
	if err != nil || n < 1 {
		return 0, 0, fmt.Errorf("rate %q: the count %q is not a whole number ≥ 1", s, ns)
	}
	given := strings.TrimSpace(ps)
	switch ps = given; ps {
	case "min":
		ps = "1m"
	case "day":
		ps = "24h"
	}
	if ps != "" && (ps[0] < '0' || ps[0] > '9') {
		ps = "1" + ps // "s" is "1s"
	}
	period, err = time.ParseDuration(ps)
	if err != nil || period <= 0 {
		return 0, 0, fmt.Errorf("rate %q: the period %q is not a positive duration (1s, 1m, 24h)", s, given)
	}
	return n, period, nil
}

// parsePolicy reads one --policy: comma-separated key=value pairs, either
// capacity, refill_amount and refill_frequency, or rate and burst, or one
// window, rolling=N/PERIOD or fixed=N/PERIOD; unit is optional ("" or
// "calls" count calls).
func parsePolicy(s string) (bucket.Policy, error) {
	fields := map[string]string{}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		k = strings.TrimSpace(k)
		switch {
		case !ok:
			return bucket.Policy{}, fmt.Errorf("%q is not key=value", kv)
		case k != "unit" && k != "capacity" && k != "refill_amount" && k != "refill_frequency" && k != "rate" && k != "burst" && k != "rolling" && k != "fixed":
			return bucket.Policy{}, fmt.Errorf("unknown key %q (want unit, capacity, refill_amount, refill_frequency; or unit, rate, burst; or unit, rolling or fixed)", k)
		}
		if _, dup := fields[k]; dup {
			return bucket.Policy{}, fmt.Errorf("%s given twice", k)
		}
		fields[k] = strings.TrimSpace(v)
	}
	unit := fields["unit"]
	if unit == "calls" {
		unit = ""
	}
	for _, k := range []string{"rolling", "fixed"} {
		v, ok := fields[k]
		if !ok {
			continue
		}
		if len(fields) > 2 || (len(fields) == 2 && !hasKey(fields, "unit")) {
			return bucket.Policy{}, fmt.Errorf("%s=N/PERIOD goes alone, with unit at most", k)
		}
		n, period, err := parseRate(v)
		if err != nil {
			return bucket.Policy{}, err
		}
		p := bucket.Policy{Unit: unit, Capacity: n, RefillAmount: n, RefillFrequency: period, Kind: kindOf(k)}
		return p, nil
	}
	_, hasRate := fields["rate"]
	_, hasBurst := fields["burst"]
	if hasRate || hasBurst {
		for _, k := range []string{"capacity", "refill_amount", "refill_frequency"} {
			if _, ok := fields[k]; ok {
				return bucket.Policy{}, fmt.Errorf("%s with rate/burst: give capacity, refill_amount and refill_frequency, or rate and burst", k)
			}
		}
		if !hasRate || !hasBurst {
			return bucket.Policy{}, fmt.Errorf("rate and burst go together (rate=200/1s,burst=50)")
		}
		p, err := ratePolicy(fields["rate"], fields["burst"])
		p.Unit = unit
		return p, err
	}
	var p bucket.Policy
	for _, k := range []string{"capacity", "refill_amount"} {
		v, ok := fields[k]
		if !ok {
			return p, fmt.Errorf("no %s (want unit=U,capacity=C,refill_amount=A,refill_frequency=D)", k)
		}
		n, err := strconv.Atoi(v)
		if err != nil {
			return p, fmt.Errorf("%s %q is not a whole number", k, v)
		}
		if k == "capacity" {
			p.Capacity = n
		} else {
			p.RefillAmount = n
		}
	}
	v, ok := fields["refill_frequency"]
	if !ok {
		return p, fmt.Errorf("no refill_frequency (want unit=U,capacity=C,refill_amount=A,refill_frequency=D)")
	}
	d, err := time.ParseDuration(v)
	if err != nil {
		return p, fmt.Errorf("refill_frequency %q is not a duration (60ms, 1s)", v)
	}
	p.Unit, p.RefillFrequency = unit, d
	return p, checkPolicy(p)
}

// ratePolicy is bucket.Rate of rate "N/PERIOD" and burst.
func ratePolicy(r, burst string) (bucket.Policy, error) {
	n, period, err := parseRate(r)
	if err != nil {
		return bucket.Policy{}, err
	}
	b, err := strconv.Atoi(burst)
	if err != nil || b < 1 {
		return bucket.Policy{}, fmt.Errorf("burst %q is not a whole number ≥ 1", burst)
	}
	if period%time.Microsecond != 0 {
		return bucket.Policy{}, fmt.Errorf("rate %q: the period is not a whole number of microseconds", r)
	}
	return bucket.Rate(n, period, b), nil
}

// checkPolicy says what is wrong with p in the words of --policy; package
// bucket checks again (New) and has the last word.
func checkPolicy(p bucket.Policy) error {
	switch {
	case p.Capacity < 1:
		return fmt.Errorf("capacity %d, want ≥ 1", p.Capacity)
	case p.RefillAmount < 1:
		return fmt.Errorf("refill_amount %d, want ≥ 1", p.RefillAmount)
	case p.RefillAmount > p.Capacity:
		return fmt.Errorf("refill_amount %d above capacity %d: tokens beyond the capacity are never usable", p.RefillAmount, p.Capacity)
	case p.RefillFrequency < time.Microsecond:
		return fmt.Errorf("refill_frequency %v, want ≥ 1µs", p.RefillFrequency)
	case p.RefillFrequency%time.Microsecond != 0:
		return fmt.Errorf("refill_frequency %v is not a whole number of microseconds", p.RefillFrequency)
	}
	return nil
}

func hasKey(m map[string]string, k string) bool {
	_, ok := m[k]
	return ok
}
