package loadgen

import (
	"sync"
	"sync/atomic"
)

// Hog starts n goroutines that keep the CPU busy, as other work in the
// same process would on a starved host, and returns a func that stops
// them and waits for them. n ≤ 0 starts none.
func Hog(n int) (stop func()) {
	var done atomic.Bool
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			x := uint64(1)
			for !done.Load() {
				// A little arithmetic between checks; the loop stays
				// preemptible (Go preempts it asynchronously).
				for range 1000 {
					x = x*6364136223846793005 + 1442695040888963407
				}
			}
			sink.Add(x)
		})
	}
	return func() {
		done.Store(true)
		wg.Wait()
	}
}

// sink keeps the hog's arithmetic from being optimised away.
var sink atomic.Uint64
