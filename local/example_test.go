package local_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/local"
)

// A Rate in front of an API that allows 10 requests a minute, refusing
// callers who would wait more than a second instead of letting them pile up.
func ExampleRate() {
	lim, err := local.NewRate(local.RateConfig{Rate: 10, Period: time.Minute, MaxWait: time.Second})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for i := range 3 {
		err := lim.Do(ctx, func(ctx context.Context) error {
			fmt.Println("request", i)
			return nil
		})
		switch {
		case errors.Is(err, sluice.ErrWaitTooLong):
			fmt.Println("request", i, "refused: the next slot is too far away")
		case err != nil:
			fmt.Println(err)
		}
	}
	// Output:
	// request 0
	// request 1 refused: the next slot is too far away
	// request 2 refused: the next slot is too far away
}

// Burst lets a quiet client send a few requests at once, then holds it to the
// rate. Burst 3 lets 3 through at once, as x/time/rate's burst 3 does.
func ExampleRate_burst() {
	lim, err := local.NewRate(local.RateConfig{Rate: 1, Period: time.Hour, Burst: 3, MaxWait: time.Minute})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for i := range 4 {
		fmt.Println(i, lim.Enter(ctx))
	}
	// Output:
	// 0 <nil>
	// 1 <nil>
	// 2 <nil>
	// 3 local: wait too long
}

// EnterN for requests that cost different amounts: an API allows 600 units
// a minute, at most 100 at once, and each request costs its size in units.
// The callers wait their turn in arrival order whatever their cost: here the
// first two spend the burst, the third waits half a second for its 5 units,
// and the fourth would wait 3 s, longer than MaxWait. A cost above the Burst
// can never be granted, so it is refused at once: split it.
func ExampleRate_EnterN() {
	lim, err := local.NewRate(local.RateConfig{Rate: 600, Period: time.Minute, Burst: 100, MaxWait: time.Second})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for _, size := range []int{60, 40, 5, 30, 250} {
		err := lim.EnterN(ctx, size)
		switch {
		case errors.Is(err, sluice.ErrCostExceedsCapacity):
			fmt.Println(size, "never:", err)
		case errors.Is(err, sluice.ErrLimited):
			fmt.Println(size, "not now:", err)
		case err != nil:
			fmt.Println(size, err)
		default:
			fmt.Println(size, "sent") // the request goes here
		}
	}
	// Output:
	// 60 sent
	// 40 sent
	// 5 sent
	// 30 not now: local: wait too long
	// 250 never: local: cost exceeds capacity: cost 250 above the Burst 100, so it could never be granted
}

// A Concurrency keeping at most two downloads in flight, with each Do bounded
// to five seconds, wait included.
func ExampleConcurrency() {
	lim, err := local.NewConcurrency(local.ConcurrencyConfig{Limit: 2, RunTimeout: 5 * time.Second})
	if err != nil {
		panic(err)
	}
	err = lim.Do(context.Background(), func(ctx context.Context) error {
		deadline, ok := ctx.Deadline()
		fmt.Println("downloading; deadline set:", ok && time.Until(deadline) <= 5*time.Second)
		return nil
	})
	fmt.Println("err:", err)
	// Output:
	// downloading; deadline set: true
	// err: <nil>
}

// Acquire and Release for work that does not fit in one function; every
// successful Acquire needs one Release.
func ExampleConcurrency_Acquire() {
	lim, err := local.NewConcurrency(local.ConcurrencyConfig{Limit: 1, AcquireTimeout: 10 * time.Millisecond})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	if err := lim.Acquire(ctx); err != nil {
		panic(err)
	}
	err = lim.Acquire(ctx) // the only slot is taken
	fmt.Println(errors.Is(err, local.ErrTimeout), errors.Is(err, sluice.ErrLimited))
	lim.Release()
	// Output: true true
}

// A Spacer keeping polls at least 20 ms apart, each on a multiple of 20 ms.
func ExampleSpacer() {
	lim, err := local.NewSpacer(local.SpacerConfig{Space: 20 * time.Millisecond, Align: true})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	begin := time.Now()
	for range 3 {
		if err := lim.Enter(ctx); err != nil {
			panic(err)
		}
	}
	// The third start is at least two spaces after the first, which is
	// not before begin. (Comparing the times at which Enter returned would
	// measure the scheduler of a busy machine, not the limiter.)
	fmt.Println("3 starts took ≥ 40ms:", time.Since(begin) >= 40*time.Millisecond)
	// Output: 3 starts took ≥ 40ms: true
}

// Code written against sluice.Limiter takes a Noop to switch limiting off,
// for example in tests.
func ExampleNoop() {
	fetch := func(ctx context.Context, lim sluice.Limiter) error {
		return lim.Do(ctx, func(ctx context.Context) error {
			fmt.Println("fetched")
			return nil
		})
	}
	if err := fetch(context.Background(), local.Noop{}); err != nil {
		panic(err)
	}
	// Output: fetched
}
