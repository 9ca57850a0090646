package lanelabel

import (
	"testing"
	"time"
)

// TestRanks: the first lanes get labels while some are free; a lane
// past them takes the label of the least busy one once it has more than
// twice its calls, counted over the current window and the one before;
// "other" never takes a label, and with no label to give every lane is
// "other".
func TestRanks(t *testing.T) {
	t0 := time.Unix(1000, 0)
	r := New(2)
	step := func(at time.Duration, lane, label, evicted string) {
		t.Helper()
		if l, e := r.Label(lane, t0.Add(at)); l != label || e != evicted {
			t.Errorf("at %v, lane %s: label %q, evicted %q; want %q, %q", at, lane, l, e, label, evicted)
		}
	}
	step(0, "a", "a", "")
	step(0, "a", "a", "")
	step(0, "b", "b", "")
	step(0, "c", "other", "")
	step(0, "c", "other", "") // 2 calls: not more than twice b's 1
	step(0, "other", "other", "")
	step(time.Second, "c", "c", "b")
	step(time.Second, "b", "other", "")
	// A window later, the calls before still count: a has 2, c 3, b 2.
	step(laneWindow+time.Second, "b", "other", "")
	step(laneWindow+time.Second, "b", "other", "") // 4: not more than twice a's 2
	step(laneWindow+time.Second, "b", "b", "a")
	// Two windows later, nothing before counts: a lane's first call
	// outnumbers idle ones.
	step(3*laneWindow+time.Second, "a", "a", "c")

	none := New(0)
	if l, e := none.Label("a", t0); l != "other" || e != "" {
		t.Errorf("no label to give: %q, %q; want other", l, e)
	}
}
