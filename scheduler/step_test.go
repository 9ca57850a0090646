package scheduler

import (
	"math"
	"testing"
	"time"
)

// TestParseStep: a step reply of the wrong shape or an unknown status is
// refused; a next step beyond 292 years of µs is clamped, never wrapped
// negative (moved here from queue's FuzzParsers and
// TestParseDurationOverflow with the step).
func TestParseStep(t *testing.T) {
	for _, c := range []struct {
		reply []any
		ok    bool
	}{
		{[]any{int64(1), int64(0), int64(4), int64(2)}, true},
		{[]any{int64(-1), int64(0), int64(0), int64(0)}, true},
		{[]any{int64(0), int64(0), int64(0), int64(3)}, true},
		{[]any{int64(2), int64(0), int64(0), int64(0)}, false},
		{[]any{int64(-2), int64(0), int64(0), int64(0)}, false},
		{[]any{int64(1), int64(0), int64(0)}, false},
		{[]any{int64(1), "x", int64(0), int64(0)}, false},
	} {
		r, err := parseStep(c.reply, nil)
		if (err == nil) != c.ok {
			t.Errorf("parseStep(%v) = %+v, %v; want ok %v", c.reply, r, err, c.ok)
		}
		if err == nil && (r.status < fenced || r.status > running) {
			t.Errorf("parseStep accepted status %d", r.status)
		}
	}
	r, err := parseStep([]any{int64(1), math.MaxInt64/int64(time.Microsecond) + 1, int64(1), int64(0)}, nil)
	if err == nil && r.next <= 0 {
		t.Errorf("step next: accepted and wrapped to %v, want an error or a clamped positive duration", r.next)
	}
}
