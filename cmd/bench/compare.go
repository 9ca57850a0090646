package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/guarantee"
	"github.com/sluicehq/sluice/internal/loadgen"
)

// Compare is the same workloads run against each contender, in one run.
type Compare struct {
	Limit    Limit           `json:"limit"` // of the saturated workload
	Callers  int             `json:"callers"`
	Duration time.Duration   `json:"duration_ns"`
	Results  []CompareResult `json:"results"` // Sluice first
}

// CompareResult is one contender's figures.
type CompareResult struct {
	Name string `json:"name"`
	Key  string `json:"key"`
	// Uncontended is sequential calls with the limit far above reach.
	Uncontended Dist `json:"uncontended"`
	// Admit is N concurrent callers released at once with the limit far
	// above reach: time until the last returns, per round.
	Admit []Admit `json:"admit"`
	// Hammer is compareHammerCallers looping with the limit far above reach.
	Hammer Hammer `json:"hammer"`
	// Saturated is Callers looping on the saturated limit for Duration.
	Saturated CompareSaturation `json:"saturated"`
}

// CompareSaturation judges a saturated run from what every contender
// shows: when each call began and when it returned.
type CompareSaturation struct {
	Grants int    `json:"grants"`
	Errors int    `json:"errors"`
	Err    string `json:"first_error,omitempty"`
	// CutOff counts calls still waiting when the run was stopped
	// (Duration + compareTail): the longest waits, not in Wait.
	CutOff     int        `json:"cut_off"`
	Throughput Throughput `json:"throughput"` // on return times
	// Excess is the worst window of the return times against the
	// guarantee; ExcessSlack the same with windows startSlack +
	// defaultMaxLateness longer (Sluice's promise for start times).
	Excess      Excess `json:"excess"`
	ExcessSlack int    `json:"excess_slack"`
	// Wait is the duration of the calls begun after the warm-up
	// (callers / rate); MaxOverMedian is Wait.Max / Wait.P50.
	Warmup        time.Duration `json:"warmup_ns"`
	Wait          Dist          `json:"wait_steady"`
	MaxOverMedian float64       `json:"wait_max_over_median"`
	// Overtaken counts grants that a call begun more than overtakeTol
	// later beat by more than overtakeTol.
	Overtaken int `json:"overtaken"`
	// RoundTrips is what a go-redis hook counted during the run.
	RoundTrips int64 `json:"round_trips"`
}

// RoundTripsPerGrant is RoundTrips per grant.
func (s CompareSaturation) RoundTripsPerGrant() float64 { return per(s.RoundTrips, s.Grants) }

const (
	compareSamples       = 1000
	compareWarmup        = 100
	compareRounds        = 3
	compareHammerCallers = 64
	compareHammer        = time.Second
	// compareTail is how long after Duration calls still waiting are
	// given before the run is cut off (redis_rate's herd can starve some).
	compareTail = 3 * time.Second
	overtakeTol = time.Millisecond
)

// compare runs every contender through the same workloads, one after the
// other, each on its own client.
func compare(ctx context.Context, opt *redis.Options, name string, cfg bucket.Config, callers int, d time.Duration, stderr io.Writer) (Compare, error) {
	sat := rateLimit{Burst: cfg.Capacity, Amount: cfg.RefillAmount, Every: cfg.RefillFrequency}
	c := Compare{
		Limit:   Limit{Capacity: sat.Burst, RefillAmount: sat.Amount, RefillFrequency: sat.Every, PerSecond: float64(sat.Amount) / sat.Every.Seconds()},
		Callers: callers, Duration: d,
	}
	for i, k := range contenders {
		fmt.Fprintf(stderr, "compare: %s: uncontended, 100 and 1,000 at once, %d looping, %d callers saturating %s/s for %v...\n",
			k.Name, compareHammerCallers, callers, num(c.Limit.PerSecond), d)
		r, err := compareOne(ctx, opt, fmt.Sprintf("%s-cmp%d", name, i), k, sat, callers, d)
		if err != nil {
			return c, fmt.Errorf("%s: %w", k.Name, err)
		}
		c.Results = append(c.Results, r)
	}
	return c, nil
}

func compareOne(ctx context.Context, opt *redis.Options, name string, k contender, sat rateLimit, callers int, d time.Duration) (CompareResult, error) {
	r := CompareResult{Name: k.Name, Key: k.Key}
	rdb := client(opt, max(1000, callers))
	defer rdb.Close()
	var rt loadgen.RoundTripCounter
	rdb.AddHook(&rt)
	// Dial the pool first: the figures are the limiter's, not the dialler's.
	if k.Redis {
		if err := concurrently(max(1000, callers), func(int) error { return rdb.Ping(ctx).Err() }); err != nil {
			return r, err
		}
	}

	l, err := k.New(rdb, name+"-seq", farAbove)
	if err != nil {
		return r, err
	}
	ds := make([]time.Duration, 0, compareSamples)
	for i := -compareWarmup; i < compareSamples; i++ {
		t := time.Now()
		if err := l.Wait(ctx); err != nil {
			l.Close()
			return r, fmt.Errorf("uncontended: %w", err)
		}
		if i >= 0 {
			ds = append(ds, time.Since(t))
		}
	}
	l.Close()
	r.Uncontended = distOf(ds)

	for _, n := range []int{100, 1000} {
		a, err := compareAdmit(ctx, rdb, fmt.Sprintf("%s-admit%d", name, n), k, n)
		if err != nil {
			return r, err
		}
		r.Admit = append(r.Admit, a)
	}
	if r.Hammer, err = compareHammerRun(ctx, rdb, &rt, name+"-hammer", k); err != nil {
		return r, err
	}
	r.Saturated, err = compareSaturate(ctx, rdb, &rt, name+"-sat", k, sat, callers, d)
	return r, err
}

// compareAdmit releases n callers at once on a fresh limiter with the limit
// far above reach, compareRounds times after an untimed round.
func compareAdmit(ctx context.Context, rdb *redis.Client, name string, k contender, n int) (Admit, error) {
	return admitBursts(ctx, Admit{Callers: n, Rounds: compareRounds}, func(round int) (func(context.Context) error, func(), error) {
		l, err := k.New(rdb, fmt.Sprintf("%s-%d", name, round), farAbove)
		if err != nil {
			return nil, nil, err
		}
		return l.Wait, func() { l.Close() }, nil
	})
}

// compareHammerRun has compareHammerCallers loop Wait with the limit far
// above reach for compareHammer.
func compareHammerRun(ctx context.Context, rdb *redis.Client, rt *loadgen.RoundTripCounter, name string, k contender) (Hammer, error) {
	h := Hammer{Callers: compareHammerCallers, Duration: compareHammer}
	l, err := k.New(rdb, name, farAbove)
	if err != nil {
		return h, err
	}
	defer l.Close()
	return hammerLoop(ctx, h, rt, l.Wait)
}

// call is one Wait of the saturated workload.
type call struct {
	start, end time.Time
	err        error
}

// compareSaturate has callers loop Wait on one limiter at the saturated
// limit; they begin no call after d, and calls still waiting at d +
// compareTail are cut off.
func compareSaturate(ctx context.Context, rdb *redis.Client, rt *loadgen.RoundTripCounter, name string, k contender, sat rateLimit, callers int, d time.Duration) (CompareSaturation, error) {
	l, err := k.New(rdb, name, sat)
	if err != nil {
		return CompareSaturation{}, err
	}
	defer l.Close()
	runCtx, cancel := context.WithTimeout(ctx, d+compareTail)
	defer cancel()
	calls := make([][]call, callers)
	before := rt.RoundTrips()
	start := time.Now()
	var wg sync.WaitGroup
	for i := range callers {
		wg.Go(func() {
			for runCtx.Err() == nil && time.Since(start) < d {
				t := time.Now()
				err := l.Wait(runCtx)
				calls[i] = append(calls[i], call{t, time.Now(), err})
			}
		})
	}
	wg.Wait()
	trips := rt.RoundTrips() - before
	if err := ctx.Err(); err != nil {
		return CompareSaturation{}, err
	}
	lim := guarantee.Limit{Capacity: sat.Burst, Amount: sat.Amount, Every: sat.Every}
	perSec := float64(sat.Amount) / sat.Every.Seconds()
	warmup := min(time.Duration(float64(callers)/perSec*float64(time.Second)), d/2)
	s := judgeCalls(slices.Concat(calls...), lim, warmup)
	s.RoundTrips = trips
	return s, nil
}

// judgeCalls analyses the calls of a saturated run: calls cut off by the
// run's end (context errors) are counted apart from errors.
func judgeCalls(calls []call, l guarantee.Limit, warmup time.Duration) CompareSaturation {
	s := CompareSaturation{Warmup: warmup}
	var begin time.Time
	for i, c := range calls {
		if i == 0 || c.start.Before(begin) {
			begin = c.start
		}
	}
	var starts, ends []time.Time
	var waits []time.Duration
	for _, c := range calls {
		switch {
		case errors.Is(c.err, context.DeadlineExceeded) || errors.Is(c.err, context.Canceled):
			s.CutOff++
			continue
		case c.err != nil:
			s.Errors++
			if s.Err == "" {
				s.Err = c.err.Error()
			}
			continue
		}
		s.Grants++
		starts = append(starts, c.start)
		ends = append(ends, c.end)
		if c.start.Sub(begin) >= warmup {
			waits = append(waits, c.end.Sub(c.start))
		}
	}
	s.Throughput = throughput(ends, l)
	s.Excess = excessOf(ends, l)
	s.ExcessSlack = guarantee.CheckSlack(ends, l, defaultMaxLateness+startSlack).Excess
	s.Wait = distOf(waits)
	if s.Wait.P50 > 0 {
		s.MaxOverMedian = float64(s.Wait.Max) / float64(s.Wait.P50)
	}
	s.Overtaken = overtakenByStart(starts, ends, overtakeTol)
	return s
}

// overtakenByStart counts the calls i for which some call j began more
// than tol after i began and returned more than tol before i returned:
// a later caller served first. starts and ends are parallel.
func overtakenByStart(starts, ends []time.Time, tol time.Duration) int {
	idx := make([]int, len(starts))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(a, b int) int { return starts[a].Compare(starts[b]) })
	// Walk from the latest start back; j moves over the calls begun more
	// than tol after the current one, keeping their earliest return.
	n := 0
	j := len(idx)
	var earliest time.Time
	seen := false
	for k := len(idx) - 1; k >= 0; k-- {
		i := idx[k]
		for j > 0 && starts[idx[j-1]].Sub(starts[i]) > tol {
			j--
			if e := ends[idx[j]]; !seen || e.Before(earliest) {
				earliest, seen = e, true
			}
		}
		if seen && ends[i].Sub(earliest) > tol {
			n++
		}
	}
	return n
}
