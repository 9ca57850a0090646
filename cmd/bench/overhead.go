package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/loadgen"
)

// Overhead is what the bucket costs when it does not limit: one process,
// a bucket whose limit is far above reach.
type Overhead struct {
	Samples int  `json:"samples"` // sequential calls timed for Ping, Script and Enter
	Ping    Dist `json:"ping"`    // go-redis Ping
	Script  Dist `json:"script"`  // EVALSHA of "return 1"
	Enter   Dist `json:"enter"`   // uncontended Enter
	// EnterOverScript is Enter.P50 / Script.P50.
	EnterOverScript float64 `json:"enter_over_script"`
	// RoundTripsPerEnter is the mean of Report.RoundTrips.
	RoundTripsPerEnter float64 `json:"round_trips_per_enter"`

	Admit  []Admit `json:"admit"`
	Hammer Hammer  `json:"hammer"`
}

// Admit is Callers concurrent Enters on a bucket with tokens to spare,
// released at once, repeated Rounds times on fresh buckets.
type Admit struct {
	Callers int `json:"callers"`
	Rounds  int `json:"rounds"`
	// Last is, per round, the time from the release of the callers until
	// the last Enter returned (P99 is meaningless over a few rounds).
	Last   Dist `json:"last"`
	Errors int  `json:"errors"`
}

// Hammer is Callers goroutines looping Enter on one bucket with the limit
// far above reach, for Duration.
type Hammer struct {
	Callers            int           `json:"callers"`
	Duration           time.Duration `json:"duration_ns"`
	Grants             int           `json:"grants"`
	Errors             int           `json:"errors"`
	PerSecond          float64       `json:"grants_per_s"`
	Enter              Dist          `json:"enter"`
	RoundTripsPerGrant float64       `json:"round_trips_per_grant"` // counted by a go-redis hook
}

const (
	overheadSamples = 2000
	overheadWarmup  = 200
	admitRounds     = 5
	hammerCallers   = 64
	hammerDuration  = 2 * time.Second
)

// unlimited is a bucket no benchmark can exhaust: a billion tokens, a
// billion more every second.
func unlimited(name string) bucket.Config {
	return bucket.Config{Name: name, Capacity: 1e9, RefillAmount: 1e9, RefillFrequency: time.Second}
}

// client is a new client of opt with room for callers connections.
func client(opt *redis.Options, callers int) *redis.Client {
	o := *opt
	o.ContextTimeoutEnabled = true
	o.PoolSize = callers + 10
	return redis.NewClient(&o)
}

func overhead(ctx context.Context, opt *redis.Options, name string) (Overhead, error) {
	o := Overhead{Samples: overheadSamples}
	rdb := client(opt, 1)
	defer rdb.Close()

	var err error
	if o.Ping, err = timeCalls(func() error { return rdb.Ping(ctx).Err() }); err != nil {
		return o, fmt.Errorf("ping: %w", err)
	}
	one := redis.NewScript("return 1")
	if err := one.Load(ctx, rdb).Err(); err != nil {
		return o, fmt.Errorf("script load: %w", err)
	}
	if o.Script, err = timeCalls(func() error { return one.EvalSha(ctx, rdb, nil).Err() }); err != nil {
		return o, fmt.Errorf("script: %w", err)
	}

	b, err := bucket.New(rdb, unlimited(name+"-enter"))
	if err != nil {
		return o, err
	}
	defer b.Close()
	var rts, n int
	if o.Enter, err = timeCalls(func() error {
		rep, err := b.EnterReport(ctx)
		rts += rep.RoundTrips
		n++
		return err
	}); err != nil {
		return o, fmt.Errorf("enter: %w", err)
	}
	o.RoundTripsPerEnter = float64(rts) / float64(n)
	if o.Script.P50 > 0 {
		o.EnterOverScript = float64(o.Enter.P50) / float64(o.Script.P50)
	}

	for _, callers := range []int{100, 1000} {
		a, err := admit(ctx, opt, fmt.Sprintf("%s-admit%d", name, callers), callers)
		if err != nil {
			return o, err
		}
		o.Admit = append(o.Admit, a)
	}
	o.Hammer, err = hammer(ctx, opt, name+"-hammer")
	return o, err
}

// timeCalls times overheadSamples sequential calls of f after
// overheadWarmup untimed ones.
func timeCalls(f func() error) (Dist, error) {
	ds := make([]time.Duration, 0, overheadSamples)
	for i := -overheadWarmup; i < overheadSamples; i++ {
		t := time.Now()
		if err := f(); err != nil {
			return Dist{}, err
		}
		if i >= 0 {
			ds = append(ds, time.Since(t))
		}
	}
	return distOf(ds), nil
}

// admit releases callers concurrent Enters at once, on a fresh unlimited
// bucket each round (one untimed round first), and times the last return.
func admit(ctx context.Context, opt *redis.Options, name string, callers int) (Admit, error) {
	a := Admit{Callers: callers, Rounds: admitRounds}
	rdb := client(opt, callers)
	defer rdb.Close()
	// Dial the pool first: the figure is the bucket's, not the dialler's.
	if err := concurrently(callers, func(int) error { return rdb.Ping(ctx).Err() }); err != nil {
		return a, err
	}
	return admitBursts(ctx, a, func(round int) (func(context.Context) error, func(), error) {
		b, err := bucket.New(rdb, unlimited(fmt.Sprintf("%s-%d", name, round)))
		if err != nil {
			return nil, nil, err
		}
		return b.Enter, func() { b.Close() }, nil
	})
}

// admitBursts runs a.Rounds timed bursts (after one untimed) of a.Callers
// calls released at once, each burst on the limiter that fresh(round)
// makes, and times the last return of each.
func admitBursts(ctx context.Context, a Admit, fresh func(round int) (wait func(context.Context) error, done func(), err error)) (Admit, error) {
	var lasts []time.Duration
	for round := -1; round < a.Rounds; round++ {
		wait, done, err := fresh(round + 1)
		if err != nil {
			return a, err
		}
		gate := make(chan struct{})
		ends := make([]time.Time, a.Callers)
		errs := make([]error, a.Callers)
		var wg sync.WaitGroup
		for i := range a.Callers {
			wg.Go(func() {
				<-gate
				errs[i] = wait(ctx)
				ends[i] = time.Now()
			})
		}
		start := time.Now()
		close(gate)
		wg.Wait()
		done()
		if err := ctx.Err(); err != nil {
			return a, err
		}
		if round < 0 {
			continue
		}
		for _, err := range errs {
			if err != nil {
				a.Errors++
			}
		}
		lasts = append(lasts, slices.MaxFunc(ends, time.Time.Compare).Sub(start))
	}
	a.Last = distOf(lasts)
	return a, nil
}

// concurrently runs f(0..n-1) at once and returns the first error.
func concurrently(n int, f func(i int) error) error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = f(i) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

// hammer runs hammerCallers goroutines looping Enter on one unlimited
// bucket for hammerDuration and counts the grants and round trips.
func hammer(ctx context.Context, opt *redis.Options, name string) (Hammer, error) {
	h := Hammer{Callers: hammerCallers, Duration: hammerDuration}
	rdb := client(opt, hammerCallers)
	defer rdb.Close()
	var rt loadgen.RoundTripCounter
	rdb.AddHook(&rt)
	if err := concurrently(hammerCallers, func(int) error { return rdb.Ping(ctx).Err() }); err != nil {
		return h, err
	}
	b, err := bucket.New(rdb, unlimited(name))
	if err != nil {
		return h, err
	}
	defer b.Close()
	return hammerLoop(ctx, h, &rt, b.Enter)
}

// hammerLoop has h.Callers goroutines loop wait for h.Duration, and fills
// in the grants, their latencies and the round trips rt counted.
func hammerLoop(ctx context.Context, h Hammer, rt *loadgen.RoundTripCounter, wait func(context.Context) error) (Hammer, error) {
	lat := make([][]time.Duration, h.Callers)
	errs := make([]int, h.Callers)
	before := rt.RoundTrips()
	start := time.Now()
	deadline := start.Add(h.Duration)
	var wg sync.WaitGroup
	for i := range h.Callers {
		wg.Go(func() {
			for ctx.Err() == nil && time.Now().Before(deadline) {
				t := time.Now()
				if err := wait(ctx); err != nil {
					errs[i]++
					continue
				}
				lat[i] = append(lat[i], time.Since(t))
			}
		})
	}
	wg.Wait()
	elapsed := time.Since(start)
	trips := rt.RoundTrips() - before
	if err := ctx.Err(); err != nil {
		return h, err
	}
	all := slices.Concat(lat...)
	for _, e := range errs {
		h.Errors += e
	}
	h.Grants = len(all)
	h.PerSecond = float64(h.Grants) / elapsed.Seconds()
	h.Enter = distOf(all)
	h.RoundTripsPerGrant = per(trips, h.Grants)
	return h, nil
}
