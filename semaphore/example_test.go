package semaphore_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/semaphore"
)

// redisAddr is where the examples' Redis listens: a throwaway redis-server
// started for this test binary (use your own server's address).
func redisAddr() string { return semaphore.ExampleRedisAddr }

func Example() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
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

func ExampleSemaphore_AcquireN() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer rdb.Close()

	// 10 GB of memory shared by every process that renders; a job takes a
	// permit worth the gigabytes it needs.
	sem, err := semaphore.New(rdb, semaphore.Config{Name: "render-memory", Capacity: 10})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sem.Close()
	ctx := context.Background()

	big, err := sem.AcquireN(ctx, 8)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("holding 8 of 10")

	// 4 more do not fit: the caller waits (here until its deadline), and
	// every caller that arrives behind it waits too, even one asking for 2.
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err = sem.AcquireN(short, 4)
	cancel()
	fmt.Println("4 more while 8 are held:", err)

	// Nobody waits any more, and 2 fit.
	small, err := sem.AcquireN(ctx, 2)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("holding 8 + 2 of 10")
	big.Release(ctx) // gives back all 8
	small.Release(ctx)

	// More than the capacity could never be granted: refused at once.
	_, err = sem.AcquireN(ctx, 12)
	fmt.Println(errors.Is(err, sluice.ErrCostExceedsCapacity), errors.Is(err, sluice.ErrLimited))
	fmt.Println(err)
	// Output:
	// holding 8 of 10
	// 4 more while 8 are held: context deadline exceeded
	// holding 8 + 2 of 10
	// true false
	// semaphore: cost exceeds capacity: weight 12 above Capacity 10 of semaphore "render-memory", so it could never be granted
}

// Stats are this process's figures, read without I/O; Inspect reads the
// semaphore across every process in one round trip.
func ExampleSemaphore_Inspect() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	sem, err := semaphore.New(rdb, semaphore.Config{Name: "reports", Capacity: 4})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sem.Close()
	ctx := context.Background()

	heavy, err := sem.AcquireN(ctx, 3)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer heavy.Release(ctx)
	st := sem.Stats()
	fmt.Printf("this process: %d granted, weight %d held\n", st.Granted, st.Held)

	in, err := sem.Inspect(ctx)
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Printf("every process: weight %d of %d held by %d permits, %d waiting\n", in.Held, in.Capacity, in.Holders, in.Queued)
	// Output:
	// this process: 1 granted, weight 3 held
	// every process: weight 3 of 4 held by 1 permits, 0 waiting
}

// With Fallback: LocalShare, an outage of Redis does not stop the
// service: each process admits callers from its share of Capacity until
// Redis answers again, then registers there what it holds.
func ExampleConfig_fallback() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer rdb.Close()

	sem, err := semaphore.New(rdb, semaphore.Config{
		Name: "db-connections", Capacity: 40,
		Fallback: semaphore.LocalShare, // 40 / n processes each while Redis is away
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sem.Close()
	ctx := context.Background()

	permit, err := sem.Acquire(ctx)
	if err != nil {
		fmt.Println(err) // Redis away and no local share: this process never reached it
		return
	}
	defer permit.Release(ctx)

	// Inspect says whether this process runs on its local share, also
	// while it cannot read Redis.
	in, err := sem.Inspect(ctx)
	if in.Local {
		fmt.Printf("on the local share since %v: 1/%d of the capacity (%v)\n", in.LocalSince, in.LocalShare, err)
	} else if err == nil {
		fmt.Println("on Redis:", in.Held, "of", in.Capacity, "held")
	}
	// Output:
	// on Redis: 1 of 40 held
}

func ExampleWithLane() {
	rdb := redis.NewClient(&redis.Options{Addr: redisAddr(), ContextTimeoutEnabled: true})
	defer rdb.Close()

	// One database writer at a time, shared by a nightly batch and the
	// requests a person waits on: those go first.
	sem, err := semaphore.New(rdb, semaphore.Config{Name: "db-writer", Capacity: 1,
		Lanes: []sluice.Lane{{Name: "interactive", Priority: 1}}})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer sem.Close()
	ctx := context.Background()

	held, err := sem.Acquire(ctx) // the batch's current write
	if err != nil {
		fmt.Println(err)
		return
	}
	served := make(chan string, 2)
	for i, lane := range []string{"batch", "interactive"} {
		go func() {
			p, err := sem.Acquire(semaphore.WithLane(ctx, lane))
			if err != nil {
				fmt.Println(err)
				return
			}
			served <- lane
			p.Release(ctx)
		}()
		waitQueued(ctx, sem, i+1) // the batch's waiter arrives first
	}
	held.Release(ctx)
	fmt.Println(<-served, "first, then", <-served)
	// Output: interactive first, then batch
}

// waitQueued returns once n callers wait for sem.
func waitQueued(ctx context.Context, sem *semaphore.Semaphore, n int) {
	for {
		if in, err := sem.Inspect(ctx); err != nil || in.Queued >= n {
			return
		}
		time.Sleep(time.Millisecond)
	}
}
