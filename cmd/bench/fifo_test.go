package main

import (
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testing/guarantee"
)

// TestFIFOGrants on made-up arrivals: a full bucket grants its capacity
// at once, then one caller a refill, in order of arrival; a caller that
// comes when tokens are there is granted on arrival.
func TestFIFOGrants(t *testing.T) {
	t0 := time.Unix(1000, 0)
	ms := func(d int) time.Time { return t0.Add(time.Duration(d) * time.Millisecond) }
	for _, tc := range []struct {
		name     string
		l        guarantee.Limit
		arrivals []int // ms
		want     []int // ms
	}{
		{"burst of 1, 5/s, three at once", guarantee.Limit{Capacity: 1, RefillAmount: 1, RefillFrequency: 200 * time.Millisecond},
			[]int{0, 0, 0}, []int{0, 200, 400}},
		{"burst of 5, 40/s, eight at once", guarantee.Limit{Capacity: 5, RefillAmount: 1, RefillFrequency: 25 * time.Millisecond},
			[]int{0, 0, 0, 0, 0, 0, 0, 0}, []int{0, 0, 0, 0, 0, 25, 50, 75}},
		{"unsorted arrivals keep their index", guarantee.Limit{Capacity: 1, RefillAmount: 1, RefillFrequency: 100 * time.Millisecond},
			[]int{30, 0, 10}, []int{200, 0, 100}},
		{"a late arrival finds tokens", guarantee.Limit{Capacity: 2, RefillAmount: 1, RefillFrequency: 100 * time.Millisecond},
			[]int{0, 0, 0, 450}, []int{0, 0, 100, 450}},
		{"refills between ticks wait for the next", guarantee.Limit{Capacity: 1, RefillAmount: 1, RefillFrequency: 100 * time.Millisecond},
			[]int{0, 150, 160}, []int{0, 150, 200}},
		{"amounts above one", guarantee.Limit{Capacity: 2, RefillAmount: 2, RefillFrequency: 100 * time.Millisecond},
			[]int{0, 0, 0, 0, 0}, []int{0, 0, 100, 100, 200}},
	} {
		var arrivals []time.Time
		for _, a := range tc.arrivals {
			arrivals = append(arrivals, ms(a))
		}
		got := fifoGrants(arrivals, tc.l)
		for i, w := range tc.want {
			if !got[i].Equal(ms(w)) {
				t.Errorf("%s: caller %d granted at %v, want %d ms", tc.name, i, got[i].Sub(t0), w)
			}
		}
		if r := guarantee.Check(got, tc.l); !r.OK() {
			t.Errorf("%s: the FIFO itself exceeds the limit: %v", tc.name, r)
		}
	}
}
