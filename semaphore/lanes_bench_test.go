package semaphore

import (
	"strconv"
	"testing"
)

// BenchmarkLanes: BenchmarkGrants' 64 callers in 4 processes on 16
// permits (every grant a handoff), in the default lane, all in one named
// lane, and each call in one of 10,000 lanes (tenants with a waiter at a
// time): redis-cpu-µs/grant is what the lanes cost Redis; it must not
// grow with the number of lanes.
//
//	go test -run '^$' -bench Lanes -count 6 ./semaphore/ | benchstat -col /lanes -
func BenchmarkLanes(b *testing.B) {
	for _, c := range []struct {
		name string
		lane func(n int64) string
	}{
		{"none", nil},
		{"1", func(int64) string { return "one" }},
		{"10000", func(n int64) string { return "tenant-" + strconv.FormatInt(n%10000, 10) }},
	} {
		b.Run("lanes="+c.name, func(b *testing.B) { benchGrants(b, 16, c.lane) })
	}
}
