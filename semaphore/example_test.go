package semaphore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/semaphore"
)

func Example() {
	srv, err := redistest.Start() // a throwaway redis-server for the example
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.Close()
	rdb := srv.Client()
	defer rdb.Close()

	// Every process that opens "crawler" on this Redis shares 2 places.
	sem, err := semaphore.New(rdb, semaphore.Config{Name: "crawler", Capacity: 2})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sem.Close()
	ctx := context.Background()

	permit, err := sem.Acquire(ctx) // waits its turn
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("holding a permit")
	select {
	case <-permit.Lost():
		fmt.Println("lease lost: stop the work")
	default:
	}
	if err := permit.Release(ctx); err != nil {
		fmt.Println(err)
	}

	// Do acquires, runs and releases; here 6 jobs, never more than 2 at once.
	var running, peak atomic.Int32
	var wg sync.WaitGroup
	for range 6 {
		wg.Go(func() {
			err := sem.Do(ctx, func(ctx context.Context) error {
				n := running.Add(1)
				defer running.Add(-1)
				for p := peak.Load(); n > p && !peak.CompareAndSwap(p, n); p = peak.Load() {
				}
				time.Sleep(5 * time.Millisecond) // the work
				return nil
			})
			if err != nil {
				fmt.Println(err)
			}
		})
	}
	wg.Wait()
	fmt.Println("jobs at once, at most:", peak.Load())
	// Output:
	// holding a permit
	// jobs at once, at most: 2
}
