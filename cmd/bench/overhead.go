package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/enterdetail"
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
	// RoundTripsPerEnter is the mean of enterdetail.Detail.RoundTrips.
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
	admitRounds     = 5
	hammerCallers   = 64
	hammerDuration  = 2 * time.Second
)

func (*Overhead) about() about {
	return about{name: "overhead", takes: "~3 s", all: true,
		what: "one process, limit out of reach: round trips, uncontended Enter, bursts of callers, grants/s"}
}

func (*Overhead) flags(*flag.FlagSet) {}
func (*Overhead) check() error        { return nil }

func (o *Overhead) run(ctx context.Context, e *env) error {
	e.logf("overhead: round trips, uncontended Enter, concurrent callers, grants/s...")
	*o = Overhead{Samples: overheadSamples}
	name := e.name
	rdb, rt, err := dialed(ctx, e.opt, 1000, true)
	if err != nil {
		return err
	}
	defer rdb.Close()

	if o.Ping, err = timeCalls(overheadSamples, func() error { return rdb.Ping(ctx).Err() }); err != nil {
		return fmt.Errorf("ping: %w", err)
	}
	one := redis.NewScript("return 1")
	if err := one.Load(ctx, rdb).Err(); err != nil {
		return fmt.Errorf("script load: %w", err)
	}
	if o.Script, err = timeCalls(overheadSamples, func() error { return one.EvalSha(ctx, rdb, nil).Err() }); err != nil {
		return fmt.Errorf("script: %w", err)
	}

	b, err := bucket.New(rdb, bucket.Config{Name: name + "-enter", Capacity: farAbove.Burst, RefillAmount: farAbove.Amount, RefillFrequency: farAbove.Every})
	if err != nil {
		return err
	}
	defer b.Close()
	var rts, n int
	var d enterdetail.Detail
	dctx := enterdetail.With(ctx, &d)
	if o.Enter, err = timeCalls(overheadSamples, func() error {
		err := b.Enter(dctx)
		rts += d.RoundTrips
		n++
		return err
	}); err != nil {
		return fmt.Errorf("enter: %w", err)
	}
	o.RoundTripsPerEnter = float64(rts) / float64(n)
	if o.Script.P50 > 0 {
		o.EnterOverScript = float64(o.Enter.P50) / float64(o.Script.P50)
	}

	o.Admit, o.Hammer, err = burstsAndHammer(ctx, rdb, rt, name, contenders[0], admitRounds, hammerDuration)
	return err
}

func (o *Overhead) table(t *table, _ Limit) {
	t.title("OVERHEAD: one process, the bucket's limit far out of reach")
	t.row("", "p50", "p99", "max", "")
	t.dist("PING round trip", o.Ping, fmt.Sprintf("%s sequential calls each", commas(o.Samples)))
	t.dist("script round trip (EVALSHA return 1)", o.Script, "")
	t.dist("Enter, uncontended", o.Enter, fmt.Sprintf("p50 = %.2f × the script's; %.2f Redis round trips per Enter", o.EnterOverScript, o.RoundTripsPerEnter))
	for _, a := range o.Admit {
		t.row(fmt.Sprintf("%s Enters at once: last returns after", commas(a.Callers)), dur(a.Last.P50), "", dur(a.Last.Max),
			fmt.Sprintf("median and max of %d rounds; %d errors", a.Rounds, a.Errors))
	}
	h := o.Hammer
	t.dist(fmt.Sprintf("%d callers looping Enter: latency", h.Callers), h.Enter, "")
	t.row(fmt.Sprintf("%d callers looping Enter: grants/s", h.Callers), commas(int(h.PerSecond+0.5)), "", "",
		fmt.Sprintf("%s grants in %v; %.3f round trips per grant (concurrent arrivals share round trips); %d errors", commas(h.Grants), h.Duration, h.RoundTripsPerGrant, h.Errors))
}

func (o *Overhead) gobench(g *gobench) {
	g.line("Overhead/ping", o.Ping.N, ns(o.Ping.P50), "ns/op", ns(o.Ping.P99), "p99-ns/op")
	g.line("Overhead/script", o.Script.N, ns(o.Script.P50), "ns/op", ns(o.Script.P99), "p99-ns/op")
	g.line("Overhead/enter", o.Enter.N, ns(o.Enter.P50), "ns/op", ns(o.Enter.P99), "p99-ns/op",
		f(o.EnterOverScript), "x-script", f(o.RoundTripsPerEnter), "round-trips/op")
	for _, a := range o.Admit {
		g.line(fmt.Sprintf("Overhead/admit-%d", a.Callers), a.Rounds, ns(a.Last.P50), "ns/burst", ns(a.Last.Max), "max-ns/burst")
	}
	h := o.Hammer
	g.line(fmt.Sprintf("Overhead/hammer-%d", h.Callers), h.Grants, f(h.PerSecond), "grants/s", ns(h.Enter.P50), "ns/op",
		ns(h.Enter.P99), "p99-ns/op", f(h.RoundTripsPerGrant), "round-trips/op")
}

// timeCalls times n sequential calls of f after n/10 untimed ones.
func timeCalls(n int, f func() error) (Dist, error) {
	ds := make([]time.Duration, 0, n)
	for i := -n / 10; i < n; i++ {
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

// dialed is a new client of opt with n connections open (when dial is
// set: the figures are then the limiter's, not the dialler's) and a
// counter of its round trips.
func dialed(ctx context.Context, opt *redis.Options, n int, dial bool) (*redis.Client, *loadgen.RoundTripCounter, error) {
	rdb := client(opt, n)
	rt := new(loadgen.RoundTripCounter)
	rdb.AddHook(rt)
	if dial {
		if err := concurrently(n, func(int) error { return rdb.Ping(ctx).Err() }); err != nil {
			rdb.Close()
			return nil, nil, err
		}
	}
	return rdb, rt, nil
}

// burstsAndHammer measures limiters of k on rdb with the limit far above
// reach: bursts of 100 and then 1,000 callers released at once (rounds
// times each, after an untimed round), then hammerCallers looping for d.
func burstsAndHammer(ctx context.Context, rdb *redis.Client, rt *loadgen.RoundTripCounter, name string, k contender, rounds int, d time.Duration) ([]Admit, Hammer, error) {
	var bursts []Admit
	for _, n := range []int{100, 1000} {
		a, err := admit(ctx, Admit{Callers: n, Rounds: rounds}, func(round int) (limiter, error) {
			return k.New(rdb, fmt.Sprintf("%s-admit%d-%d", name, n, round), farAbove)
		})
		if err != nil {
			return nil, Hammer{}, err
		}
		bursts = append(bursts, a)
	}
	l, err := k.New(rdb, name+"-hammer", farAbove)
	if err != nil {
		return nil, Hammer{}, err
	}
	defer l.Close()
	h, err := hammer(ctx, Hammer{Callers: hammerCallers, Duration: d}, rt, l.Wait)
	return bursts, h, err
}

// admit runs a.Rounds timed bursts (after one untimed) of a.Callers
// calls released at once, each burst on the limiter that fresh(round)
// makes, and times the last return of each.
func admit(ctx context.Context, a Admit, fresh func(round int) (limiter, error)) (Admit, error) {
	var lasts []time.Duration
	for round := -1; round < a.Rounds; round++ {
		l, err := fresh(round + 1)
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
				errs[i] = l.Wait(ctx)
				ends[i] = time.Now()
			})
		}
		start := time.Now()
		close(gate)
		wg.Wait()
		l.Close()
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
	return errors.Join(errs...)
}

// hammer has h.Callers goroutines loop wait for h.Duration, and fills in
// the grants, their latencies and the round trips rt counted.
func hammer(ctx context.Context, h Hammer, rt *loadgen.RoundTripCounter, wait func(context.Context) error) (Hammer, error) {
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
