package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/bench/workers"
	"github.com/sluicehq/sluice/internal/enterdetail"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
)

// Impatient is callers whose deadline is shorter than the queue: an
// application that gives each call to a limited API 500 ms, and when the
// limiter cannot let it start in time, fails it (the caller then waits a
// moment and calls again). Saturated, most calls cannot be served in
// time: they should fail at once, not at their deadline, while the
// limit is still used to the last token and never exceeded. Sluice's
// bucket.Enter and go-redis/redis_rate used as its users use it (Allow;
// when refused, sleep RetryAfter if that fits before the deadline and
// Allow again, else fail) run in the same worker processes, each on a
// key of its own at the same limit.
type Impatient struct {
	Procs    int           `json:"procs"`
	Callers  int           `json:"callers"` // of each limiter, spread over the processes
	Duration time.Duration `json:"duration_ns"`
	Deadline time.Duration `json:"deadline_ns"` // of each call, from its arrival
	Backoff  time.Duration `json:"backoff_ns"`  // after a failed call
	Rate     int           `json:"rate_per_s"`
	Burst    int           `json:"burst"`
	// Apart runs the limiters one after the other rather than side by
	// side (--impatient-apart).
	Apart bool `json:"apart"`
	// Results has one limiter each, sluice first.
	Results []LimiterRun `json:"results"`
	// ReadyLate is how long after the run's common start the last worker
	// process was ready to call (0: all were ready in time).
	ReadyLate time.Duration `json:"ready_late_ns"`
}

// The goals of the impatient scenario, for sluice.
const (
	impatientUtilGoal = 0.9
	impatientFailGoal = 10 * time.Millisecond // a failed call's time from its arrival, p50
)

// workerStart is how long before the run begins its worker processes are
// started: time to start and connect.
const workerStart = time.Second

func (*Impatient) about() about {
	return about{name: "impatient", takes: "~7 s", all: true,
		what: "saturated callers that give each call 500 ms and fail it when it cannot start in time, with sluice and redis_rate side by side: utilization, how fast a call that cannot be served fails, the limit"}
}

func (im *Impatient) flags(fs *flag.FlagSet) {
	fs.IntVar(&im.Procs, "impatient-procs", 4, "worker processes")
	fs.IntVar(&im.Callers, "impatient-callers", 200, "callers of each limiter in total, spread over the processes")
	fs.DurationVar(&im.Duration, "impatient-duration", 5*time.Second, "how long the callers keep calling")
	fs.DurationVar(&im.Deadline, "impatient-deadline", 500*time.Millisecond, "each call's deadline, from its arrival")
	fs.DurationVar(&im.Backoff, "impatient-backoff", 20*time.Millisecond, "how long a caller whose call failed waits before it calls again")
	fs.IntVar(&im.Rate, "impatient-rate", 200, "the limit: calls a second")
	fs.IntVar(&im.Burst, "impatient-burst", 20, "the limit's burst (the bucket's capacity)")
	fs.BoolVar(&im.Apart, "impatient-apart", false, "run sluice and redis_rate one after the other instead of side by side")
}

func (im *Impatient) check() error {
	if err := checkLoad("impatient-", im.Callers, im.Procs, im.Duration); err != nil {
		return err
	}
	switch {
	case im.Deadline <= 0:
		return fmt.Errorf("--impatient-deadline %v: want > 0", im.Deadline)
	case im.Backoff < 0:
		return fmt.Errorf("--impatient-backoff %v: want ≥ 0", im.Backoff)
	}
	return checkRate("impatient-", im.Rate, im.Burst)
}

// checkRate checks --<prefix>rate and --<prefix>burst.
func checkRate(prefix string, rate, burst int) error {
	switch {
	case rate < 1 || rate > 1_000_000:
		return fmt.Errorf("--%srate %d: want between 1 and 1,000,000", prefix, rate)
	case burst < 1:
		return fmt.Errorf("--%sburst %d: want ≥ 1", prefix, burst)
	}
	return nil
}

func (im *Impatient) run(ctx context.Context, e *env) error {
	im.Results, im.ReadyLate = nil, 0
	phases := [][]string{{limSluice, limRedisRate}}
	if im.Apart {
		phases = [][]string{{limSluice}, {limRedisRate}}
	}
	how := "side by side"
	if im.Apart {
		how = "one after the other"
	}
	e.logf("impatient: %d callers of each limiter in %d processes, %s, for %v at %d/s, burst %d; each call %v to start, %v pause after a failure...",
		im.Callers, im.Procs, how, im.Duration, im.Rate, im.Burst, im.Deadline, im.Backoff)
	for i, lims := range phases {
		begin := time.Now().Add(workerStart)
		specs := make([]callersSpec, im.Procs)
		for p := range specs {
			specs[p] = callersSpec{Proc: p, workerTarget: e.workers(), Name: fmt.Sprintf("%s-%d", e.name, i), Limiters: lims,
				Rate: im.Rate, Burst: im.Burst, Callers: share(im.Callers, im.Procs, p), Deadline: im.Deadline, Backoff: im.Backoff,
				Begin: begin.UnixNano(), Until: begin.Add(im.Duration).UnixNano()}
		}
		results, err := workers.Run[callersSpec, callersResult](ctx, callersEnv, specs)
		if err != nil {
			return err
		}
		runs, late := judgeCallers(results, lims, im.Rate, im.Burst, begin, im.Duration)
		im.Results = append(im.Results, runs...)
		im.ReadyLate = max(im.ReadyLate, late)
	}
	return nil
}

// NoExcess reports whether sluice held the limit, by grant time and by
// start time in the windows it promises.
func (im *Impatient) NoExcess() bool {
	return len(im.Results) > 0 && im.Results[0].NoExcess()
}

func (im *Impatient) table(t *table, _ Limit) {
	how := "side by side in the same processes, each on a key of its own"
	if im.Apart {
		how = "one after the other in fresh processes, each on a key of its own"
	}
	t.title("IMPATIENT: %d callers of each limiter in %d processes call for %v, each call given %v to start (a caller whose call fails waits %v and calls again); sluice and redis_rate %s, at %d/s, burst %d",
		im.Callers, im.Procs, im.Duration, im.Deadline, im.Backoff, how, im.Rate, im.Burst)
	res := im.Results
	if len(res) == 0 {
		return
	}
	sl := res[0]
	header := []string{""}
	for _, r := range res {
		header = append(header, r.Name)
	}
	t.row(append(header, "")...)
	row := func(name string, v func(LimiterRun) string, note string) {
		cells := []string{name}
		for _, r := range res {
			cells = append(cells, v(r))
		}
		t.row(append(cells, note)...)
	}
	l := guarantee.Limit{Capacity: sl.Capacity, RefillAmount: sl.RefillAmount, RefillFrequency: sl.RefillFrequency}
	row("utilization", func(r LimiterRun) string { return fmt.Sprintf("%.3f", r.Utilization) },
		fmt.Sprintf("sluice: %s; grants that started within the run / what the limit allows over it (%s in %v)",
			t.goal(sl.Utilization >= impatientUtilGoal, fmt.Sprintf("≥ %.1f", impatientUtilGoal)), commas(l.Allowed(im.Duration)), im.Duration))
	row("calls", func(r LimiterRun) string { return commas(r.Calls) }, "made before the run's end and returned by it")
	row("  granted", func(r LimiterRun) string { return commas(r.Granted) }, "")
	row("  failed", func(r LimiterRun) string { return fmt.Sprintf("%s (%s)", commas(r.Failed()), pct(r.Failed(), r.Calls)) },
		fmt.Sprintf("could not start within %v, or an error (sluice %d, redis_rate %d errors%s)", im.Deadline, sl.Errors, other(res).Errors, firstErr(res)))
	row("failed call: time from its arrival, p50", func(r LimiterRun) string { return dur(r.FailedIn.P50) },
		"sluice: "+t.goal(sl.Failed() == 0 || sl.FailedIn.P50 <= impatientFailGoal, "≤ "+dur(impatientFailGoal))+"; a call that cannot be served in time should fail at once, not at its deadline")
	row("  p99 / max", func(r LimiterRun) string { return dur(r.FailedIn.P99) + " / " + dur(r.FailedIn.Max) }, "")
	row("granted call: wait, p50", func(r LimiterRun) string { return dur(r.Wait.P50) }, "from its arrival to its start")
	row("  p99 / max", func(r LimiterRun) string { return dur(r.Wait.P99) + " / " + dur(r.Wait.Max) }, "")
	row("excess over the limit", func(r LimiterRun) string { return fmt.Sprint(max(r.Excess, 0)) },
		"sluice: "+t.goal(sl.Excess <= 0, "0")+"; the busiest window against the limit (checker), sluice by grant time (Redis's clock), redis_rate by start time (it has no other)")
	row(fmt.Sprintf("  by start time, windows %s longer", dur(bucketSlack())), func(r LimiterRun) string { return fmt.Sprint(max(r.ExcessSlack, 0)) },
		"sluice: "+t.goal(sl.ExcessSlack <= 0, "0")+"; windows MaxLateness + the reply's trip longer: the bucket's promise for start times")
	row("Redis calls per grant", func(r LimiterRun) string { return fmt.Sprintf("%.2f", r.RoundTripsPerGrant()) }, "every command and pipeline of the limiter's clients, in every process")
	row("cut off at the run's end", func(r LimiterRun) string { return commas(r.CutOff) }, "calls still waiting when the run ended: not counted above")
	if im.ReadyLate > 0 {
		t.row("late start", dur(im.ReadyLate), "", fmt.Sprintf("the last worker process was ready to call %s after the run's start", dur(im.ReadyLate)))
	}
}

func (im *Impatient) gobench(g *gobench) {
	for _, r := range im.Results {
		g.line("Impatient/"+r.Name, r.Calls,
			f(r.Utilization), "utilization",
			r.Failed(), "failed",
			ms(r.FailedIn.P50), "ms-failed-p50",
			ms(r.Wait.P50), "ms-wait-p50",
			r.Excess, "excess",
			r.ExcessSlack, "excess-slack",
			f(r.RoundTripsPerGrant()), "round-trips/op",
			r.Errors, "errors")
	}
}

// other is the first result after sluice's, or a zero one.
func other(res []LimiterRun) LimiterRun {
	if len(res) > 1 {
		return res[1]
	}
	return LimiterRun{}
}

// firstErr is "; first: ..." with the first error of any result, or "".
func firstErr(res []LimiterRun) string {
	for _, r := range res {
		if r.Err != "" {
			return fmt.Sprintf("; first, %s: %s", r.Name, r.Err)
		}
	}
	return ""
}

// The limiters a callers worker runs.
const (
	limSluice    = "sluice"
	limRedisRate = "redis_rate"
)

// LimiterRun is one limiter's calls over one run, judged.
type LimiterRun struct {
	Name string `json:"name"`
	// The limit, as the bucket's policy and the checker's.
	Capacity        int           `json:"capacity"`
	RefillAmount    int           `json:"refill_amount"`
	RefillFrequency time.Duration `json:"refill_frequency_ns"`

	// Calls are those made and returned before the run's end; Granted of
	// them started, OutOfTime could not start before their deadline (or
	// were refused because they could not), Errors failed otherwise.
	Calls     int    `json:"calls"`
	Granted   int    `json:"granted"`
	OutOfTime int    `json:"out_of_time"`
	Errors    int    `json:"errors"`
	Err       string `json:"first_error,omitempty"`
	// CutOff counts the calls still waiting at the run's end.
	CutOff int `json:"cut_off"`
	// InRun counts the grants whose start lies within the run; Allowed is
	// what the limit allows over it (guarantee.Limit.Allowed);
	// Utilization is InRun / Allowed.
	InRun       int     `json:"in_run"`
	Allowed     int     `json:"allowed"`
	Utilization float64 `json:"utilization"`
	// Settled is the utilization after the run's first second (0 for a
	// run shorter than two): the grants that started from then to its
	// end, against the refills the limit gives over that span, its burst
	// left out. A run that begins with every caller arriving at once on
	// a full bucket loses most of what it loses in that second.
	Settled float64 `json:"settled_utilization"`
	// FailedIn is how long the failed calls took from their arrival;
	// Wait how long the granted ones waited to start.
	FailedIn Dist `json:"failed_in"`
	Wait     Dist `json:"wait"`
	// Excess is the busiest window against the limit (guarantee.Check):
	// of sluice's grant times (Redis's clock), of redis_rate's start
	// times; ExcessSlack that of the start times in windows MaxLateness +
	// 2 ms longer (guarantee.CheckSlack). ≤ 0: the limit held.
	Excess      int `json:"excess"`
	ExcessSlack int `json:"excess_slack"`
	// Retimes sums bucket.Report.Retimes (sluice only); Refunds counts
	// those that started at once with the missed grant's tokens.
	Retimes int `json:"retimes"`
	Refunds int `json:"refunds"`
	// Claims counts the grants a sluice caller took from one that had
	// not come for it (enterdetail.Detail.Claims).
	Claims int `json:"claims"`
	// RoundTrips counts the commands and pipelines of the limiter's
	// clients in every process (loadgen.RoundTripCounter).
	RoundTrips int64 `json:"round_trips"`
}

// Failed counts the calls that did not start.
func (r LimiterRun) Failed() int { return r.OutOfTime + r.Errors }

// NoExcess reports whether the limit held by grant time and by start
// time in the longer windows.
func (r LimiterRun) NoExcess() bool { return r.Excess <= 0 && r.ExcessSlack <= 0 }

// RoundTripsPerGrant is RoundTrips per grant.
func (r LimiterRun) RoundTripsPerGrant() float64 { return per(r.RoundTrips, r.Granted) }

// judgeCallers judges, for each limiter of lims, the calls of every
// worker's results over the run from begin, d long; late is how long
// after begin the last worker was ready.
func judgeCallers(results []callersResult, lims []string, rate, burst int, begin time.Time, d time.Duration) (runs []LimiterRun, late time.Duration) {
	p := bucket.Rate(rate, time.Second, burst)
	l := guarantee.Limit{Capacity: p.Capacity, RefillAmount: p.RefillAmount, RefillFrequency: p.RefillFrequency}
	for _, r := range results {
		late = max(late, r.ReadyLate)
	}
	for _, name := range lims {
		var calls []callRecord
		run := LimiterRun{Name: name, Capacity: l.Capacity, RefillAmount: l.RefillAmount, RefillFrequency: l.RefillFrequency}
		for _, r := range results {
			calls = append(calls, r.Calls[name]...)
			run.CutOff += r.CutOff[name]
			run.RoundTrips += r.RoundTrips[name]
		}
		run.judge(calls, l, begin, d)
		runs = append(runs, run)
	}
	return runs, late
}

// settleTime is how much of a run LimiterRun.Settled leaves out.
const settleTime = time.Second

// judge fills run's figures from its calls over the run from begin, d
// long, against l.
func (run *LimiterRun) judge(calls []callRecord, l guarantee.Limit, begin time.Time, d time.Duration) {
	end := begin.Add(d)
	settledFrom := begin.Add(settleTime)
	settled := 0
	var grantTimes, starts []time.Time
	var failed, waits []time.Duration
	for _, c := range calls {
		run.Calls++
		took := time.Duration(c.End - c.Start)
		switch {
		case c.OutOfTime:
			run.OutOfTime++
			failed = append(failed, took)
			continue
		case c.Err != "":
			run.Errors++
			if run.Err == "" {
				run.Err = c.Err
			}
			failed = append(failed, took)
			continue
		}
		run.Granted++
		run.Retimes += c.Retimes
		run.Refunds += c.Refunds
		run.Claims += c.Claims
		start := time.Unix(0, c.End)
		starts = append(starts, start)
		waits = append(waits, took)
		if c.Slot != 0 {
			grantTimes = append(grantTimes, time.UnixMicro(c.Slot))
		} else {
			grantTimes = append(grantTimes, start)
		}
		if !start.Before(begin) && !start.After(end) {
			run.InRun++
		}
		if !start.Before(settledFrom) && !start.After(end) {
			settled++
		}
	}
	run.Allowed = l.Allowed(d)
	run.Utilization = float64(run.InRun) / float64(run.Allowed)
	if refills := int((d - settleTime) / l.RefillFrequency); d >= 2*settleTime && refills > 0 {
		run.Settled = float64(settled) / float64(refills*l.RefillAmount)
	}
	run.FailedIn, run.Wait = distOf(failed), distOf(waits)
	run.Excess = guarantee.Check(grantTimes, l).Excess
	run.ExcessSlack = guarantee.CheckSlack(starts, l, bucketSlack()).Excess
}

// callersEnv makes this binary a worker of the impatient and pods
// scenarios (callersWorker).
const callersEnv = "SLUICE_BENCH_CALLERS_WORKER"

// The scenarios' worker processes are this binary run again; here rather
// than in main so that the scenario stays in its file.
func init() { workers.Serve(callersEnv, "callers worker", callersWorker) }

// callersSpec is one worker process's callers: for each limiter named,
// Callers goroutines that call it in a loop, on a key of its own.
type callersSpec struct {
	Proc int `json:"proc"`
	workerTarget
	Name     string   `json:"name"` // the keys: Name-<limiter>
	Limiters []string `json:"limiters"`
	Rate     int      `json:"rate"` // a second
	Burst    int      `json:"burst"`
	Callers  int      `json:"callers"` // of each limiter
	// Deadline is each call's, from its arrival (0: none but the run's
	// end); Backoff how long a caller waits after a failed call.
	Deadline time.Duration `json:"deadline"`
	Backoff  time.Duration `json:"backoff"`
	// Spin is the rounds of busy arithmetic a caller does after each
	// grant (its work, on the CPU); Hog the busy goroutines the process
	// runs beside its callers (loadgen.Hog).
	Spin int `json:"spin,omitempty"`
	Hog  int `json:"hog,omitempty"`
	// The callers begin at Begin (unix ns) and stop at Until: calls
	// still waiting then are cut off.
	Begin int64 `json:"begin_unix_ns"`
	Until int64 `json:"until_unix_ns"`
}

// callersResult is what a callers worker reports: by limiter, its calls,
// those cut off at the run's end and its clients' round trips.
type callersResult struct {
	GOMAXPROCS int                     `json:"gomaxprocs"`
	ReadyLate  time.Duration           `json:"ready_late_ns"` // ready after Begin by this much (0: in time)
	Calls      map[string][]callRecord `json:"calls"`
	CutOff     map[string]int          `json:"cut_off"`
	RoundTrips map[string]int64        `json:"round_trips"`
}

// callRecord is one call: granted, out of time, or failed with Err.
type callRecord struct {
	Start int64 `json:"s"`            // unix ns: its arrival
	End   int64 `json:"e"`            // unix ns: its return
	Slot  int64 `json:"sl,omitempty"` // unix µs: sluice's grant time, on Redis's clock
	// OutOfTime: it could not start before its deadline (it ended, or
	// the limiter refused the call because it would).
	OutOfTime bool   `json:"t,omitempty"`
	Err       string `json:"err,omitempty"`
	Retimes   int    `json:"rtm,omitempty"`
	Refunds   int    `json:"rf,omitempty"` // enterdetail.Detail.Refunds
	Claims    int    `json:"cl,omitempty"` // enterdetail.Detail.Claims
}

// errPastDeadline is redis_rate's caller giving up at once: the
// RetryAfter it was told ends after its deadline.
var errPastDeadline = errors.New("redis_rate: RetryAfter ends after the deadline")

// callFunc makes one call; rec gets its slot and retimes, if any.
type callFunc func(ctx context.Context, deadline time.Time, rec *callRecord) error

// callersWorker is one worker process: it runs the spec's callers and
// writes a callersResult to stdout.
func callersWorker(raw string) error {
	var spec callersSpec
	ctx, stop, opt, err := openWorker(raw, &spec)
	if err != nil {
		return err
	}
	defer stop()
	res := callersResult{GOMAXPROCS: runtime.GOMAXPROCS(0), Calls: map[string][]callRecord{}, CutOff: map[string]int{}, RoundTrips: map[string]int64{}}
	p := bucket.Rate(spec.Rate, time.Second, spec.Burst)
	calls := map[string]callFunc{}
	counters := map[string]*loadgen.RoundTripCounter{}
	for _, name := range spec.Limiters {
		rdb := client(opt, spec.Callers)
		defer rdb.Close()
		if err := rdb.Ping(ctx).Err(); err != nil { // connect before the start
			return err
		}
		counters[name] = &loadgen.RoundTripCounter{}
		rdb.AddHook(counters[name])
		key := spec.Name + "-" + name
		switch name {
		case limSluice:
			b, err := bucket.New(rdb, bucket.Config{Name: key, Capacity: p.Capacity, RefillAmount: p.RefillAmount, RefillFrequency: p.RefillFrequency})
			if err != nil {
				return err
			}
			defer b.Close()
			calls[name] = func(ctx context.Context, _ time.Time, rec *callRecord) error {
				var d enterdetail.Detail
				rep, err := b.EnterReport(enterdetail.With(ctx, &d))
				if !d.Slot.IsZero() {
					rec.Slot = d.Slot.UnixMicro()
				}
				rec.Retimes, rec.Refunds, rec.Claims = rep.Retimes, d.Refunds, d.Claims
				return err
			}
		case limRedisRate:
			l, err := newRedisRate(rdb, key, rateLimit{Burst: spec.Burst, Amount: spec.Rate, Every: time.Second})
			if err != nil {
				return err
			}
			r := l.(*redisRateLimiter)
			calls[name] = func(ctx context.Context, deadline time.Time, _ *callRecord) error {
				return redisRateCall(ctx, r, deadline)
			}
		default:
			return fmt.Errorf("no limiter %q", name)
		}
	}
	begin, until := time.Unix(0, spec.Begin), time.Unix(0, spec.Until)
	if late := time.Since(begin); late > 0 {
		res.ReadyLate = late
	} else if err := sleepUntil(ctx, begin); err != nil {
		return err
	}
	stopHog := loadgen.Hog(spec.Hog)
	runCtx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	var (
		mu sync.Mutex
		wg sync.WaitGroup
	)
	for _, name := range spec.Limiters {
		call := calls[name]
		for range spec.Callers {
			wg.Go(func() {
				var mine []callRecord
				cut := 0
				for runCtx.Err() == nil {
					rec, err := callOnce(runCtx, call, spec.Deadline)
					if err != nil && (runCtx.Err() != nil || time.Until(until) < time.Millisecond ||
						rec.OutOfTime && spec.Deadline == 0) {
						// The run's end, not the call's deadline: a call
						// without one of its own refused because its turn
						// comes after the run's end (sluice says so at
						// once, redis_rate sleeps to the end) is cut off,
						// not made again at once (it spun a pod's CPU
						// quota away on refusals, 80,000 a run).
						cut++
						break
					}
					mine = append(mine, rec)
					switch {
					case err != nil && spec.Backoff > 0:
						sleepCtx(runCtx, spec.Backoff)
					case err == nil && spec.Spin > 0:
						spin(spec.Spin)
					}
				}
				mu.Lock()
				res.Calls[name] = append(res.Calls[name], mine...)
				res.CutOff[name] += cut
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	stopHog()
	if err := ctx.Err(); err != nil {
		return err
	}
	for name, c := range counters {
		res.RoundTrips[name] = c.RoundTrips()
	}
	return json.NewEncoder(os.Stdout).Encode(res)
}

// callOnce makes one call under its deadline (none when deadline is 0)
// and records it.
func callOnce(ctx context.Context, call callFunc, deadline time.Duration) (callRecord, error) {
	start := time.Now()
	rec := callRecord{Start: start.UnixNano()}
	cctx, cancel := ctx, context.CancelFunc(func() {})
	var dl time.Time
	if deadline > 0 {
		dl = start.Add(deadline)
		cctx, cancel = context.WithDeadline(ctx, dl)
	}
	err := call(cctx, dl, &rec)
	rec.End = time.Now().UnixNano()
	cancel()
	switch {
	case err == nil:
	case errors.Is(err, errPastDeadline) || errors.Is(err, sluice.ErrLimited) || errors.Is(err, context.DeadlineExceeded) ||
		ctx.Err() == nil && errors.Is(cctx.Err(), context.DeadlineExceeded):
		// Out of time, however the limiter said it: refused because it
		// would be, or at the deadline (go-redis may call it an i/o
		// timeout).
		rec.OutOfTime = true
	default:
		rec.Err = err.Error()
	}
	return rec, err
}

// redisRateCall is redis_rate used as its users use it: Allow; when
// refused, sleep RetryAfter if it ends before deadline (zero: no
// deadline) and Allow again, else fail at once.
func redisRateCall(ctx context.Context, r *redisRateLimiter, deadline time.Time) error {
	for {
		res, err := r.l.Allow(ctx, r.key, r.limit)
		if err != nil {
			return err
		}
		if res.Allowed > 0 {
			return nil
		}
		wake := time.Now().Add(res.RetryAfter)
		if !deadline.IsZero() && wake.After(deadline) {
			return errPastDeadline
		}
		if err := sleepUntil(ctx, wake); err != nil {
			return err
		}
	}
}

// spin does n rounds of busy arithmetic: work on the CPU.
func spin(n int) {
	x := uint64(1)
	for range n {
		x = x*6364136223846793005 + 1442695040888963407
	}
	spinSink.Add(x)
}

// spinSink keeps spin's arithmetic from being optimised away.
var spinSink atomic.Uint64

// spinRounds is how many rounds of spin take d of CPU on this machine:
// the fastest of a few timed runs, so that the scheduler's interruptions
// count as little as possible.
func spinRounds(d time.Duration) int {
	const probe = 1 << 18
	best := time.Duration(math.MaxInt64)
	for range 7 {
		t := time.Now()
		spin(probe)
		best = min(best, time.Since(t))
	}
	return max(1, int(float64(probe)*float64(d)/float64(max(best, time.Nanosecond))))
}
