package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/bench/workers"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
	"github.com/sluicehq/sluice/internal/testing/upstreamtest"
	"github.com/sluicehq/sluice/transport"
	"github.com/sluicehq/sluice/upstream"
)

// Upstream is issue 13's table: a strict HTTP upstream on loopback
// (internal/testing/upstreamtest: a token bucket judged at each request's
// arrival, 429 with Retry-After in whole seconds rounded up,
// X-RateLimit-Limit and -Remaining on every answer; or, in the -openai
// cases, OpenAI's headers, whose reset until full says the upstream's
// rate) driven by callers in several worker processes, each sending
// through a transport.Transport around one bucket.Bucket shared in Redis.
// Each case runs with the bucket fed back (the transport hands every
// answer to the bucket: holds and syncs, with Config.Adapt or without)
// and not (each refused caller waits out Retry-After alone, as a
// well-behaved client without a shared limiter does), side by side.
type Upstream struct {
	Procs    int           `json:"procs"`
	Callers  int           `json:"callers"`
	Duration time.Duration `json:"duration_ns"` // of the at-limit and over-limit cases
	Rate     int           `json:"upstream_rate"`
	Burst    int           `json:"upstream_burst"`
	Outage   time.Duration `json:"outage_ns"`
	Only     string        `json:"cases,omitempty"` // --upstream-cases
	Rows     []UpstreamRow `json:"rows"`
}

// UpstreamRow is one case run in one feedback mode, as the upstream saw
// it.
type UpstreamRow struct {
	Case     string `json:"case"`     // "at-limit", "at-limit-headroom", "25pct-over", "outage", "at-limit-openai", "25pct-over-openai"
	Feedback string `json:"feedback"` // "hold+sync", "hold+sync+adapt" or "off"
	// Configured is the bucket's rate, requests a second, and Capacity
	// its capacity.
	Configured float64 `json:"configured_per_s"`
	Capacity   int     `json:"capacity"`
	// Arrivals is every request the upstream judged; Refused those it
	// answered 429 (503s of an outage are counted apart, in Outage).
	Arrivals int `json:"arrivals"`
	Accepted int `json:"accepted"`
	Refused  int `json:"refused_429"`
	// Span is from the first arrival to the last. Utilization is
	// Accepted over what the upstream's policy allowed in it: its burst
	// plus its rate × Span.
	Span        time.Duration `json:"span_ns"`
	Utilization float64       `json:"utilization"`
	// Errors counts requests that failed in the workers (not an answer
	// of the upstream); Err is the first.
	Errors int    `json:"errors"`
	Err    string `json:"first_error,omitempty"`
	// Slowed is the rate in force at the end, requests a second, when
	// Adapt lowered it (0: not lowered).
	Slowed float64 `json:"slowed_per_s,omitempty"`
	// Outage is the outage case's judgement.
	Outage *UpstreamOutage `json:"outage,omitempty"`
}

// UpstreamOutage judges the outage case. The hold is the one the
// upstream's first 503 announced: from its arrival, Retry-After long.
type UpstreamOutage struct {
	RetryAfter time.Duration `json:"retry_after_ns"`
	// Unavailable is the 503s the upstream answered.
	Unavailable int `json:"unavailable_503"`
	// DuringHold is the requests that reached the upstream inside the
	// hold, after its first 503; InFlight those of them that arrived
	// within upstreamInFlight of it, sent before the fleet could have
	// heard (a slot already handed out, a request on the wire).
	DuringHold int `json:"during_hold"`
	InFlight   int `json:"in_flight"`
	// Excess is the busiest window of the arrivals of the whole run
	// against the bucket's promise (windows MaxLateness + 2 ms longer, as
	// the bucket promises for starts): ≤ 0 when no window was above it.
	Excess int `json:"excess"`
	// After counts the requests accepted after the hold.
	After int `json:"accepted_after"`
}

// upstreamInFlight is how soon after the hold's first 503 an arrival is
// counted as already on its way: a slot due within the lookahead (20 ms)
// was handed out before the bucket heard, and the request then crosses
// loopback.
const upstreamInFlight = 25 * time.Millisecond

// upstreamEnv makes this binary a worker of the upstream scenario (see
// upstreamWorker).
const upstreamEnv = "SLUICE_BENCH_UPSTREAM_WORKER"

// The scenario's worker processes are this binary run again; here rather
// than in main so that the scenario stays in its file.
func init() { workers.Serve(upstreamEnv, "upstream worker", upstreamWorker) }

func (*Upstream) about() about {
	return about{name: "upstream", takes: "~4.5 min",
		what: "a strict HTTP upstream driven through the transport from several processes: at its limit, 25 % above it, and an announced outage, fed back or not; at its limit and above it again with OpenAI's headers"}
}

func (u *Upstream) flags(fs *flag.FlagSet) {
	fs.IntVar(&u.Procs, "upstream-procs", 4, "worker processes")
	fs.IntVar(&u.Callers, "upstream-callers", 32, "callers in total, spread over the processes")
	fs.DurationVar(&u.Duration, "upstream-duration", 30*time.Second, "how long the at-limit and 25 %-over cases run (the outage case runs 7 s)")
	fs.IntVar(&u.Rate, "upstream-rate", 100, "the upstream's limit, requests a second")
	fs.IntVar(&u.Burst, "upstream-burst", 20, "the upstream's burst: requests it accepts at once")
	fs.StringVar(&u.Only, "upstream-cases", "", "run only these cases, comma-separated ("+strings.Join(u.caseNames(), ", ")+"); \"\" runs all")
	// Whole seconds: the first 503 announces it exactly as Retry-After.
	u.Outage = 2 * time.Second
}

func (u *Upstream) check() error {
	if err := checkLoad("upstream-", u.Callers, u.Procs, u.Duration); err != nil {
		return err
	}
	switch {
	case u.Rate < 1 || u.Rate > 100_000:
		return fmt.Errorf("--upstream-rate %d: want between 1 and 100,000", u.Rate)
	case u.Burst < 1:
		return fmt.Errorf("--upstream-burst %d: want ≥ 1", u.Burst)
	}
	for _, name := range strings.Split(u.Only, ",") {
		if name != "" && !slices.ContainsFunc(u.cases(), func(c upstreamCase) bool { return c.name == name }) {
			return fmt.Errorf("--upstream-cases: no case %q (%s)", name, strings.Join(u.caseNames(), ", "))
		}
	}
	return nil
}

// The goals of issue 13.
const (
	upstreamAtLimitRefused = 0.001 // share of requests refused
	upstreamAtLimitUtil    = 0.99
	upstreamOverRefused    = 0.01
	upstreamOverUtil       = 0.9
)

// The feedback modes: the transport feeds every answer back to the
// bucket (holds and syncs), with Config.Adapt or without; or the bucket
// hears nothing and each refused caller waits out Retry-After alone.
const (
	fbHoldSync = "hold+sync"
	fbAdapt    = "hold+sync+adapt"
	fbOff      = "off"
)

// upstreamCase is one case to run.
type upstreamCase struct {
	name     string
	rate     int           // the bucket's, requests a second
	capacity int           // the bucket's
	duration time.Duration // how long the callers send
	outageAt time.Duration // when the outage begins, from the start (0: none)
	modes    []string      // the feedback modes it runs in
	// openai: the upstream answers with OpenAI's headers (limit,
	// remaining, a reset until full), read with upstream.OpenAI.
	openai bool
	// over: the bucket is configured above the upstream (the goals
	// above its limit apply, not those at it).
	over bool
	// rolling: the upstream allows its rate in any rolling second (its
	// burst unused); the bucket is a rolling window at that limit, or,
	// with asRate, a token bucket at that rate with the upstream's burst,
	// for contrast.
	rolling, asRate bool
	// cold: the workers start on cold connections (no Ping before the
	// start), so the first requests arrive a few ms after their slots
	// while the upstream, full, loses its refills (issue 31).
	cold bool
}

// The goals of a rolling window at the upstream's exact limit.
const (
	upstreamRollingUtil = 0.98
)

func (u *Upstream) cases() []upstreamCase {
	all := []string{fbHoldSync, fbAdapt, fbOff}
	fed := []string{fbHoldSync, fbAdapt}
	return []upstreamCase{
		{name: "at-limit", rate: u.Rate, capacity: u.Burst, duration: u.Duration, modes: all},
		// The same on cold connections: the first requests come late.
		{name: "at-limit-cold", rate: u.Rate, capacity: u.Burst, duration: u.Duration, modes: []string{fbHoldSync}, cold: true},
		// One request of headroom: what a user does once they have seen
		// the row above.
		{name: "at-limit-headroom", rate: u.Rate, capacity: max(u.Burst-1, 1), duration: u.Duration, modes: []string{fbHoldSync}},
		{name: "25pct-over", rate: u.Rate * 5 / 4, capacity: u.Burst, duration: u.Duration, modes: all, over: true},
		{name: "outage", rate: u.Rate, capacity: u.Burst, duration: 3*time.Second + 2*u.Outage, outageAt: 2 * time.Second, modes: all},
		// The same upstream in OpenAI's words: its rate is said on every
		// answer, which Adapt steps to.
		{name: "at-limit-openai", rate: u.Rate, capacity: u.Burst, duration: u.Duration, modes: fed, openai: true},
		{name: "25pct-over-openai", rate: u.Rate * 5 / 4, capacity: u.Burst, duration: u.Duration, modes: fed, openai: true, over: true},
		// An upstream that allows its rate in any rolling second, and a
		// bucket configured at exactly that: a rolling window, and for
		// contrast a token bucket of that rate and the upstream's burst.
		{name: "rolling-window", rate: u.Rate, capacity: u.Rate, duration: u.Duration, modes: []string{fbHoldSync}, rolling: true},
		{name: "rolling-as-rate", rate: u.Rate, capacity: u.Burst, duration: u.Duration, modes: []string{fbHoldSync}, rolling: true, asRate: true},
	}
}

// caseOf is the case called name (the zero case when none is).
func (u *Upstream) caseOf(name string) upstreamCase {
	for _, c := range u.cases() {
		if c.name == name {
			return c
		}
	}
	return upstreamCase{}
}

func (u *Upstream) caseNames() []string {
	var names []string
	for _, c := range u.cases() {
		names = append(names, c.name)
	}
	return names
}

func (u *Upstream) run(ctx context.Context, e *env) error {
	u.Rows = nil
	for _, c := range u.cases() {
		if u.Only != "" && !slices.Contains(strings.Split(u.Only, ","), c.name) {
			continue
		}
		for _, fb := range c.modes {
			e.logf("upstream: %s, feedback %s: %d callers in %d processes for %v, bucket at %d/s capacity %d, upstream %d/s burst %d...",
				c.name, fb, u.Callers, u.Procs, c.duration, c.rate, c.capacity, u.Rate, u.Burst)
			row, err := u.runCase(ctx, e, c, fb)
			if err != nil {
				return fmt.Errorf("%s, feedback %s: %w", c.name, fb, err)
			}
			u.Rows = append(u.Rows, row)
		}
	}
	return nil
}

// runCase starts a fresh upstream, runs the workers against it through a
// fresh bucket, and judges what the upstream saw.
func (u *Upstream) runCase(ctx context.Context, e *env, c upstreamCase, feedback string) (UpstreamRow, error) {
	upCfg := upstreamtest.Config{Policies: []upstreamtest.Policy{{Rate: u.Rate, Burst: u.Burst}}, Remaining: true}
	if c.rolling {
		upCfg.Policies[0].Window = time.Second
	}
	up := upstreamtest.New
	if c.openai {
		up = upstreamtest.NewOpenAI
	}
	srv := up(upCfg)
	defer srv.Close()
	p := bucket.Rate(c.rate, time.Second, c.capacity)
	cfg := bucket.Config{Name: fmt.Sprintf("%s-%s-%s", e.name, c.name, feedback),
		Capacity: p.Capacity, RefillAmount: p.RefillAmount, RefillFrequency: p.RefillFrequency, Adapt: feedback == fbAdapt}
	burst := u.Burst // the upstream's, for its utilization
	if c.rolling {
		burst = u.Rate // a rolling second allows its rate at once
	}
	if c.rolling && !c.asRate {
		p = bucket.Rolling(c.rate, time.Second)
		cfg.Capacity, cfg.RefillAmount, cfg.RefillFrequency, cfg.Policies = 0, 0, 0, []bucket.Policy{p}
	}
	// Time for the workers to start and connect before the run begins.
	begin := time.Now().Add(time.Second)
	specs := make([]upstreamSpec, u.Procs)
	for i := range specs {
		specs[i] = upstreamSpec{workerTarget: e.workers(), Bucket: cfg, Upstream: srv.URL(), OpenAI: c.openai, Callers: share(u.Callers, u.Procs, i),
			Feedback: feedback != fbOff, Cold: c.cold, Begin: begin.UnixNano(), Until: begin.Add(c.duration).UnixNano()}
	}
	if c.outageAt > 0 {
		t := time.AfterFunc(time.Until(begin.Add(c.outageAt)), func() { srv.Outage(u.Outage) })
		defer t.Stop()
	}
	results, err := workers.Run[upstreamSpec, upstreamResult](ctx, upstreamEnv, specs)
	if err != nil {
		return UpstreamRow{}, err
	}
	row := judgeUpstream(srv.Arrivals(), u.Rate, burst)
	row.Case, row.Feedback = c.name, feedback
	row.Configured, row.Capacity = float64(p.RefillAmount)/p.RefillFrequency.Seconds(), p.Capacity
	for _, r := range results {
		row.Errors += r.Errors
		if row.Err == "" {
			row.Err = r.Err
		}
	}
	if cfg.Adapt {
		// The rate in force, as a process reading the bucket now sees it.
		rdb := client(e.opt, 1)
		b, err := bucket.New(rdb, bucket.Config{Name: cfg.Name, Capacity: cfg.Capacity, RefillAmount: cfg.RefillAmount, RefillFrequency: cfg.RefillFrequency, Adopt: true})
		if err == nil {
			if ps, err := b.Policies(ctx); err == nil && len(ps) > 0 && ps[0] != p {
				row.Slowed = float64(ps[0].RefillAmount) / ps[0].RefillFrequency.Seconds()
			}
			b.Close()
		}
		rdb.Close()
	}
	if c.outageAt > 0 {
		lim := guarantee.Limit{Capacity: p.Capacity, RefillAmount: p.RefillAmount, RefillFrequency: p.RefillFrequency}
		row.Outage = judgeOutage(srv.Arrivals(), u.Outage, lim, defaultMaxLateness+startSlack)
	}
	return row, nil
}

// judgeUpstream counts what the upstream answered and its utilization.
func judgeUpstream(arrivals []upstreamtest.Arrival, rate, burst int) UpstreamRow {
	var row UpstreamRow
	row.Arrivals = len(arrivals)
	for _, a := range arrivals {
		switch a.Status {
		case http.StatusOK:
			row.Accepted++
		case http.StatusTooManyRequests:
			row.Refused++
		}
	}
	if len(arrivals) > 1 {
		row.Span = arrivals[len(arrivals)-1].At.Sub(arrivals[0].At)
	}
	row.Utilization = float64(row.Accepted) / (float64(burst) + float64(rate)*row.Span.Seconds())
	return row
}

// judgeOutage judges the arrivals of the outage case: hold is the
// Retry-After of its first 503 (the outage, in whole seconds), lim the
// bucket's policy, slack how much longer its windows are judged for
// starts.
func judgeOutage(arrivals []upstreamtest.Arrival, hold time.Duration, lim guarantee.Limit, slack time.Duration) *UpstreamOutage {
	o := &UpstreamOutage{}
	first := -1
	for i, a := range arrivals {
		if a.Status == http.StatusServiceUnavailable {
			o.Unavailable++
			if first < 0 {
				first = i
			}
		}
	}
	if first >= 0 {
		o.RetryAfter = hold
		start := arrivals[first].At
		end := start.Add(o.RetryAfter)
		for _, a := range arrivals[first+1:] {
			switch {
			case a.At.Before(end):
				o.DuringHold++
				if a.At.Sub(start) < upstreamInFlight {
					o.InFlight++
				}
			case a.Status == http.StatusOK:
				o.After++
			}
		}
	}
	var at []time.Time
	for _, a := range arrivals {
		at = append(at, a.At)
	}
	o.Excess = guarantee.CheckSlack(at, lim, slack).Excess
	return o
}

// upstreamSpec is one worker process's share of a case.
type upstreamSpec struct {
	workerTarget
	Bucket   bucket.Config `json:"bucket"`
	Upstream string        `json:"upstream"`
	OpenAI   bool          `json:"openai,omitempty"` // read the answers with upstream.OpenAI
	Callers  int           `json:"callers"`
	Feedback bool          `json:"feedback"`
	Cold     bool          `json:"cold,omitempty"` // no Ping before the start: the first requests connect
	Begin    int64         `json:"begin_unix_ns"`  // the callers start then
	Until    int64         `json:"until_unix_ns"`  // and send nothing new after
}

// upstreamResult is what a worker process reports.
type upstreamResult struct {
	Requests int    `json:"requests"` // answered by the upstream, retries included
	Errors   int    `json:"errors"`
	Err      string `json:"first_error,omitempty"`
}

// upstreamWorker is one worker process: its callers send GETs to the
// upstream through a Transport around the shared bucket until the spec's
// end, and it writes an upstreamResult to stdout.
// runEnds reports that err refused a request whose turn comes after the
// run's end (its ctx's deadline, the only one it has): the caller is done.
func runEnds(err error) bool {
	var wt *sluice.WaitTooLongError
	return errors.As(err, &wt) && wt.Deadline
}

func upstreamWorker(raw string) error {
	var spec upstreamSpec
	ctx, stop, opt, err := openWorker(raw, &spec)
	if err != nil {
		return err
	}
	defer stop()
	rdb := client(opt, spec.Callers)
	defer rdb.Close()
	if !spec.Cold {
		if err := rdb.Ping(ctx).Err(); err != nil { // connect before the start
			return err
		}
	}
	b, err := bucket.New(rdb, spec.Bucket)
	if err != nil {
		return err
	}
	defer b.Close()
	// Without feedback the Transport sees a limiter that is no Receiver:
	// it waits out a refusal's Retry-After in the refused caller alone.
	var lim interface {
		Enter(context.Context) error
		Do(context.Context, func(context.Context) error) error
	} = b
	if !spec.Feedback {
		lim = unheard{b}
	}
	headers := upstream.Default
	if spec.OpenAI {
		headers = upstream.OpenAI
	}
	base := &http.Transport{MaxIdleConnsPerHost: spec.Callers}
	defer base.CloseIdleConnections()
	c := &http.Client{Transport: transport.New(base, lim, transport.WithHeaders(headers))}

	select {
	case <-time.After(time.Until(time.Unix(0, spec.Begin))):
	case <-ctx.Done():
		return ctx.Err()
	}
	until := time.Unix(0, spec.Until)
	// Requests still waiting at the end are let go: the run is over.
	runCtx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	var (
		mu  sync.Mutex
		res upstreamResult
		wg  sync.WaitGroup
	)
	for range spec.Callers {
		wg.Go(func() {
			for runCtx.Err() == nil {
				req, _ := http.NewRequestWithContext(runCtx, "GET", spec.Upstream, nil)
				resp, err := c.Do(req)
				if runEnds(err) {
					return
				}
				if err != nil {
					// The run's end is not an error: go-redis may report
					// the deadline as a socket timeout a moment before the
					// ctx says it ended (the semaphore's rule: within 1 ms
					// of the deadline counts as the deadline).
					if runCtx.Err() == nil && time.Until(until) > time.Millisecond {
						mu.Lock()
						res.Errors++
						if res.Err == "" {
							res.Err = err.Error()
						}
						mu.Unlock()
					}
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				s := headers.Parse(resp)
				mu.Lock()
				res.Requests++
				mu.Unlock()
				// Retries ran out on a refusal: a caller of its own obeys
				// the Retry-After before its next request; with feedback
				// the bucket's hold already does, for every caller.
				if s.Refused && !spec.Feedback {
					sleepCtx(runCtx, s.RetryAfter)
				}
			}
		})
	}
	wg.Wait()
	return json.NewEncoder(os.Stdout).Encode(res)
}

// unheard is a Bucket without its Feedback: the transport cannot steer it.
type unheard struct{ b *bucket.Bucket }

func (u unheard) Enter(ctx context.Context) error { return u.b.Enter(ctx) }
func (u unheard) Do(ctx context.Context, fn func(context.Context) error) error {
	return u.b.Do(ctx, fn)
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

func (u *Upstream) table(t *table, _ Limit) {
	t.title("UPSTREAM: a strict HTTP upstream (%d requests a second, burst %d, Retry-After in whole seconds rounded up; its limit and remaining on every answer, and in the -openai cases, in OpenAI's words, its reset until full too, which says its rate) driven through the transport by %d callers in %d processes sharing one bucket",
		u.Rate, u.Burst, u.Callers, u.Procs)
	t.row("case", "feedback", "bucket", "refused (429)", "utilization", "")
	for _, r := range u.Rows {
		c := u.caseOf(r.Case)
		share := per(int64(r.Refused), r.Arrivals)
		var verdict string
		switch {
		case r.Feedback == fbOff:
			verdict = "no goal: for contrast"
		case r.Outage != nil:
			verdict = "the hold is judged below; utilization not judged"
		case r.Case == "at-limit-headroom":
			verdict = "no goal: the at-limit goals with one request of headroom"
		case c.asRate:
			verdict = "no goal: for contrast, a token bucket at the rolling window's rate"
		case c.rolling:
			verdict = t.goal(r.Refused == 0, "no 429") + "; " + t.goal(r.Utilization >= upstreamRollingUtil, "utilization ≥ 0.98")
		case c.over && r.Feedback != fbAdapt:
			// Holds and syncs lower a level; only Adapt lowers a rate.
			verdict = "no goal: for contrast, only Adapt slows a bucket configured above the upstream"
		case c.over:
			verdict = t.goal(share <= upstreamOverRefused, "429s ≤ 1 %") + "; " + t.goal(r.Utilization >= upstreamOverUtil, "utilization ≥ 0.9")
		case c.cold:
			verdict = t.goal(r.Refused == 0, "no 429") + "; " + t.goal(r.Utilization >= upstreamAtLimitUtil, "utilization ≥ 0.99")
		default:
			verdict = t.goal(share <= upstreamAtLimitRefused, "429s ≤ 0.1 %") + "; " + t.goal(r.Utilization >= upstreamAtLimitUtil, "utilization ≥ 0.99")
		}
		switch {
		case r.Refused == 0 || r.Feedback == fbOff:
		case c.openai && r.Feedback == fbAdapt:
			verdict += fmt.Sprintf("; each 429 holds the fleet until its reset says a request is back (%v), not for its Retry-After (1 s)", time.Second/time.Duration(u.Rate))
		default:
			verdict += "; each 429 holds the whole fleet for its Retry-After (1 s)"
		}
		if r.Slowed > 0 {
			verdict += fmt.Sprintf("; Adapt left the rate at %s/s", num(r.Slowed))
		}
		if r.Errors > 0 {
			verdict += fmt.Sprintf("; %d errors, first: %s", r.Errors, r.Err)
		}
		bucketOf := fmt.Sprintf("%s/s, capacity %d", num(r.Configured), r.Capacity)
		if c.rolling && !c.asRate {
			bucketOf = fmt.Sprintf("%d in any 1s", r.Capacity)
		}
		t.row(r.Case, r.Feedback, bucketOf,
			fmt.Sprintf("%s of %s", pct(r.Refused, r.Arrivals), commas(r.Arrivals)), fmt.Sprintf("%.4f", r.Utilization), verdict)
	}
	for _, r := range u.Rows {
		o := r.Outage
		if o == nil {
			continue
		}
		t.row(fmt.Sprintf("outage of %v, feedback %s", u.Outage, r.Feedback), "", "", "", "", "")
		if o.Unavailable == 0 {
			t.row("  the outage refused nothing", "", "", "", "", "")
			continue
		}
		late := o.DuringHold - o.InFlight
		hold := fmt.Sprintf("%d of them within %v of the first 503, already on their way", o.InFlight, upstreamInFlight)
		if r.Feedback != fbOff {
			hold = t.goal(late == 0, "none after those") + "; " + hold
		} else {
			hold = "no goal: each caller stops only at its own 503; " + hold
		}
		t.row(fmt.Sprintf("  requests during the %v hold", o.RetryAfter), fmt.Sprint(o.DuringHold), "", "", "", hold)
		never := fmt.Sprintf("windows %v longer, as the bucket promises for starts", defaultMaxLateness+startSlack)
		if r.Feedback != fbOff {
			never = t.goal(o.Excess <= 0, "never over") + "; " + never
		}
		t.row("  busiest window of arrivals vs the bucket's promise", vsLimit(o.Excess), "", "", "", never)
		t.row("  accepted after the hold", commas(o.After), "", "", "", fmt.Sprintf("%d answered 503 in all", o.Unavailable))
	}
}

func (u *Upstream) gobench(g *gobench) {
	for _, r := range u.Rows {
		name := fmt.Sprintf("Upstream/%s/feedback=%s", r.Case, r.Feedback)
		metrics := []any{f(100 * per(int64(r.Refused), r.Arrivals)), "pct-refused", f(r.Utilization), "utilization", r.Errors, "errors"}
		if o := r.Outage; o != nil {
			metrics = append(metrics, o.DuringHold, "during-hold", o.DuringHold-o.InFlight, "during-hold-after-in-flight", o.Excess, "excess")
		}
		g.line(name, r.Arrivals, metrics...)
	}
}
