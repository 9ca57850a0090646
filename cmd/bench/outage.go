package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net"
	"os"
	"os/signal"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/bench/workers"
	"github.com/sluicehq/sluice/internal/rediscall"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// Outage is Redis going away under load: callers in several worker
// processes saturate one bucket, each Enter with a deadline, while the
// redis-server is killed (SIGKILL) and, some seconds later, restarted
// empty on the same port. It runs twice: with Config.Fallback =
// LocalShare, and without a fallback, the contrast. Every grant is
// recorded, on the host's clock, and judged: how many the fleet made
// while Redis was away, whether any window held more than the bucket's
// promise plus one Capacity (the switch), how long a call took at most,
// and the rate once Redis is back.
//
// It kills and restarts a redis-server of its own, started for each run:
// a server given with --redis is never touched.
type Outage struct {
	Procs    int           `json:"procs"`
	Callers  int           `json:"callers"`
	Deadline time.Duration `json:"deadline_ns"` // of each Enter
	Duration time.Duration `json:"duration_ns"` // of each run
	At       time.Duration `json:"kill_at_ns"`  // the kill, from the start
	For      time.Duration `json:"down_for_ns"` // from the kill to the restart
	Rows     []OutageRow   `json:"rows"`
}

// OutageRow is one run.
type OutageRow struct {
	Fallback string  `json:"fallback"` // outageLocal or outageNone
	Limit    float64 `json:"limit_per_s"`
	Capacity int     `json:"capacity"`
	// Down and Back are when the server was killed and when the new one
	// first answered, from the start of the run.
	Down time.Duration `json:"down_ns"`
	Back time.Duration `json:"back_ns"`
	// Calls counts every Enter; Grants those granted, Local those of
	// them the local share admitted (Report.Local).
	Calls  int `json:"calls"`
	Grants int `json:"grants"`
	Local  int `json:"local_grants"`
	// LocalFrom and LocalTo are when the first and the last local grant
	// returned, from the start of the run (0 without one): the switches.
	LocalFrom time.Duration `json:"local_from_ns,omitempty"`
	LocalTo   time.Duration `json:"local_to_ns,omitempty"`
	// During is the grants from Down to Back; Allowed what the limit
	// allows over that time (its rate × the time, no burst).
	During  int     `json:"outage_grants"`
	Allowed float64 `json:"outage_allowed"`
	// Sec and Tenth are the busiest windows of 1 s and 100 ms.
	Sec   OutageWindow `json:"worst_1s"`
	Tenth OutageWindow `json:"worst_100ms"`
	// Excess is the worst window of any length over the promise plus one
	// Capacity (≤ 0: held).
	Excess int `json:"excess_any_window"`
	// Longest is the longest call, granted or not; LongestErr its error
	// ("" when granted).
	Longest    time.Duration `json:"longest_call_ns"`
	LongestErr string        `json:"longest_call_error,omitempty"`
	// Gap is the longest time without a grant, from GapAt (from the
	// start of the run).
	Gap   time.Duration `json:"longest_gap_ns"`
	GapAt time.Duration `json:"longest_gap_at_ns"`
	// Recovery is the rate from 1 s after Back to the end over the limit;
	// RecoveryGrants and RecoverySpan what it is made of.
	Recovery       float64       `json:"recovery_rate_over_limit"`
	RecoveryGrants int           `json:"recovery_grants"`
	RecoverySpan   time.Duration `json:"recovery_span_ns"`
	// Failed counts the calls that failed by kind (outageErrKind), Example
	// the first error of each kind.
	Failed  map[string]int    `json:"failed"`
	Example map[string]string `json:"failed_example"`
}

// OutageWindow is the busiest window of one length: Most grants (start
// times) in a window of Window, At from the start of the run, against
// Bound, the promise for start times plus one Capacity.
type OutageWindow struct {
	Window time.Duration `json:"window_ns"`
	Most   int           `json:"most"`
	At     time.Duration `json:"at_ns"`
	Bound  int           `json:"bound"`
}

// The runs.
const (
	outageLocal = "local-share" // Config.Fallback = bucket.LocalShare
	outageNone  = "none"        // the zero value: calls fail while Redis is away
)

// The bucket: 200/s, burst 20.
const (
	outageCapacity = 20
	outageRefill   = 5 * time.Millisecond // one token each
)

// The goals.
const (
	outageDuring       = 0.6  // grants while Redis is away, over the limit's
	outageRecoveryLow  = 0.8  // the rate after recovery over the limit, at least
	outageRecoveryHigh = 1.05 // and at most
	outageOverDeadline = 100 * time.Millisecond
	// outageSettle is how long after the restart the recovery is left
	// out of the rate after recovery.
	outageSettle = time.Second
)

// outagePause is how long a caller whose Enter failed waits before it
// calls again, as an application would, rather than spin on a Redis that
// refuses connections.
const outagePause = 100 * time.Millisecond

// outageEnv makes this binary a worker of the outage scenario
// (outageWorker).
const outageEnv = "SLUICE_BENCH_OUTAGE_WORKER"

// The scenario's worker processes are this binary run again; here rather
// than in main so that the scenario stays in its file.
func init() { workers.Serve(outageEnv, "outage worker", outageWorker) }

func (*Outage) about() about {
	return about{name: "outage", takes: "~30 s",
		what:  "Redis killed under load and restarted empty, with the local share (Fallback: LocalShare) and without a fallback: grants while away, busiest windows, longest call, rate after; kills only a redis-server of its own",
		needs: "it kills and restarts a redis-server of its own"}
}

func (o *Outage) flags(fs *flag.FlagSet) {
	fs.IntVar(&o.Procs, "outage-procs", 4, "worker processes")
	fs.IntVar(&o.Callers, "outage-callers", 200, "callers in total, spread over the processes")
	fs.DurationVar(&o.Deadline, "outage-deadline", 2*time.Second, "each Enter's deadline")
	fs.DurationVar(&o.Duration, "outage-duration", 12*time.Second, "how long each of the two runs lasts")
	fs.DurationVar(&o.At, "outage-at", 4*time.Second, "when Redis is killed, from the start of a run")
	fs.DurationVar(&o.For, "outage-for", 5*time.Second, "how long Redis stays down before it is restarted empty")
}

func (o *Outage) check() error {
	if err := checkLoad("outage-", o.Callers, o.Procs, o.Duration); err != nil {
		return err
	}
	switch {
	case o.Deadline <= 0:
		return fmt.Errorf("--outage-deadline %v: want > 0", o.Deadline)
	case o.At <= 0 || o.For <= 0:
		return fmt.Errorf("--outage-at %v, --outage-for %v: want both > 0", o.At, o.For)
	case o.At+o.For+outageSettle >= o.Duration:
		return fmt.Errorf("--outage-duration %v: want more than --outage-at + --outage-for + %v (%v), to measure the rate after recovery",
			o.Duration, outageSettle, o.At+o.For+outageSettle)
	}
	return nil
}

func (o *Outage) run(ctx context.Context, e *env) error {
	o.Rows = nil
	for _, fb := range []string{outageLocal, outageNone} {
		e.logf("outage: fallback %s: %d callers in %d processes for %v on 200/s burst %d, deadline %v; Redis killed at %v, restarted empty %v later...",
			fb, o.Callers, o.Procs, o.Duration, outageCapacity, o.Deadline, o.At, o.For)
		row, err := o.runOnce(ctx, e, fb)
		if err != nil {
			return fmt.Errorf("fallback %s: %w", fb, err)
		}
		o.Rows = append(o.Rows, row)
	}
	return nil
}

// runOnce starts a redis-server, runs the workers against it while it is
// killed and restarted, and judges their grants.
func (o *Outage) runOnce(ctx context.Context, e *env, fb string) (OutageRow, error) {
	srv, err := redistest.StartService()
	if errors.Is(err, redistest.ErrNoRedisServer) {
		return OutageRow{}, errors.New("needs redis-server on PATH: it kills and restarts a server of its own")
	}
	if err != nil {
		return OutageRow{}, err
	}
	defer srv.Close()
	cfg := bucket.Config{Name: e.name + "-" + fb, Capacity: outageCapacity, RefillAmount: 1, RefillFrequency: outageRefill}
	if fb == outageLocal {
		cfg.Fallback = bucket.LocalShare
	}
	// Time for the workers to start and connect before the run begins.
	begin := time.Now().Add(time.Second)
	until := begin.Add(o.Duration)
	specs := make([]outageSpec, o.Procs)
	for i := range specs {
		specs[i] = outageSpec{Addr: srv.Addr(), Bucket: cfg, Callers: share(o.Callers, o.Procs, i), Deadline: o.Deadline,
			Begin: begin.UnixNano(), Until: until.UnixNano()}
	}

	// The faults, on their own goroutine while the workers run; runCtx
	// stops it if the workers end early.
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		down, back time.Time
		faultErr   error
		wg         sync.WaitGroup
	)
	wg.Go(func() {
		if sleepUntil(runCtx, begin.Add(o.At)) != nil {
			return
		}
		if faultErr = srv.Kill(); faultErr != nil {
			return
		}
		down = time.Now()
		if sleepUntil(runCtx, down.Add(o.For)) != nil {
			return
		}
		if faultErr = srv.Restart(); faultErr != nil {
			return
		}
		back = time.Now() // Restart returns once the new server answers
	})
	results, err := workers.Run[outageSpec, outageResult](runCtx, outageEnv, specs)
	cancel()
	wg.Wait()
	switch {
	case err != nil:
		return OutageRow{}, err
	case faultErr != nil:
		return OutageRow{}, faultErr
	case down.IsZero() || back.IsZero():
		return OutageRow{}, errors.New("the run ended before Redis was killed and restarted")
	}
	return judgeRedisOutage(fb, results, begin, down, back, until, o.Deadline), nil
}

// judgeRedisOutage judges the workers' results of one run that began at
// begin, with Redis away from down to back, until the end.
func judgeRedisOutage(fb string, results []outageResult, begin, down, back, until time.Time, deadline time.Duration) OutageRow {
	l := guarantee.Limit{Capacity: outageCapacity, RefillAmount: 1, RefillFrequency: outageRefill}
	rate := float64(l.RefillAmount) / l.RefillFrequency.Seconds()
	row := OutageRow{Fallback: fb, Limit: rate, Capacity: l.Capacity, Down: down.Sub(begin), Back: back.Sub(begin),
		Failed: map[string]int{}, Example: map[string]string{}}
	var ts []time.Time
	for _, r := range results {
		row.Calls += r.Calls
		if r.Local > 0 {
			from, to := time.Unix(0, r.LocalFrom).Sub(begin), time.Unix(0, r.LocalTo).Sub(begin)
			if row.Local == 0 || from < row.LocalFrom {
				row.LocalFrom = from
			}
			row.LocalTo = max(row.LocalTo, to)
		}
		row.Local += r.Local
		for _, g := range r.Grants {
			ts = append(ts, time.Unix(0, g))
		}
		if r.Longest > row.Longest {
			row.Longest, row.LongestErr = r.Longest, r.LongestErr
		}
		for kind, n := range r.Failed {
			row.Failed[kind] += n
			if _, ok := row.Example[kind]; !ok {
				row.Example[kind] = r.Example[kind]
			}
		}
	}
	slices.SortFunc(ts, time.Time.Compare)
	row.Grants = len(ts)
	between := func(from, to time.Time) int {
		i := sort.Search(len(ts), func(i int) bool { return !ts[i].Before(from) })
		j := sort.Search(len(ts), func(i int) bool { return !ts[i].Before(to) })
		return j - i
	}
	row.During = between(down, back)
	row.Allowed = rate * back.Sub(down).Seconds()
	settled := back.Add(outageSettle)
	row.RecoveryGrants, row.RecoverySpan = between(settled, until), until.Sub(settled)
	if row.RecoverySpan > 0 {
		row.Recovery = float64(row.RecoveryGrants) / (rate * row.RecoverySpan.Seconds())
	}
	// Start times may lag their slots by up to MaxLateness (the bucket's
	// promise for them: windows that much longer); the switch may cost
	// one Capacity more.
	slack := defaultMaxLateness + startSlack
	bound := l
	bound.Capacity += l.Capacity
	row.Sec = busiest(ts, time.Second, begin, bound.Allowed(time.Second+slack))
	row.Tenth = busiest(ts, 100*time.Millisecond, begin, bound.Allowed(100*time.Millisecond+slack))
	row.Excess = guarantee.CheckSlack(ts, bound, slack).Excess
	from := begin
	for _, t := range append(ts, until) {
		if gap := t.Sub(from); gap > row.Gap {
			row.Gap, row.GapAt = gap, from.Sub(begin)
		}
		from = t
	}
	return row
}

// busiest is the most of the sorted times ts in any closed window of
// length w.
func busiest(ts []time.Time, w time.Duration, begin time.Time, bound int) OutageWindow {
	b := OutageWindow{Window: w, Bound: bound}
	for i, j := 0, 0; i < len(ts); i++ {
		for j < len(ts) && ts[j].Sub(ts[i]) <= w {
			j++
		}
		if j-i > b.Most {
			b.Most, b.At = j-i, ts[i].Sub(begin)
		}
	}
	return b
}

// DuringMet: the fleet granted at least outageDuring of the limit while
// Redis was away.
func (r OutageRow) DuringMet() bool { return float64(r.During) >= outageDuring*r.Allowed }

// RecoveryMet: the rate after recovery is within the goal's range.
func (r OutageRow) RecoveryMet() bool {
	return r.Recovery >= outageRecoveryLow && r.Recovery <= outageRecoveryHigh
}

// FailedCalls is the calls that failed, of every kind.
func (r OutageRow) FailedCalls() int {
	n := 0
	for _, c := range r.Failed {
		n += c
	}
	return n
}

func (o *Outage) table(t *table, _ Limit) {
	t.title("OUTAGE: %d callers in %d processes saturate one bucket of 200/s burst %d, each Enter with a %s deadline (a failed caller waits %s before calling again); the redis-server is killed (SIGKILL) %s in and restarted empty on the same port %s later; %s a run, times from its start",
		o.Callers, o.Procs, outageCapacity, dur(o.Deadline), dur(outagePause), dur(o.At), dur(o.For), dur(o.Duration))
	for _, r := range o.Rows {
		switch r.Fallback {
		case outageLocal:
			t.row("Fallback: LocalShare", "", fmt.Sprintf("Redis away from %s to %s", secs(r.Down), secs(r.Back)))
		default:
			t.row("no fallback (the contrast)", "", fmt.Sprintf("Redis away from %s to %s", secs(r.Down), secs(r.Back)))
		}
		note := fmt.Sprintf("the limit's %s over %s away", commas(int(r.Allowed+0.5)), dur(r.Back-r.Down))
		if r.Fallback == outageLocal {
			note = t.goal(r.DuringMet(), fmt.Sprintf("≥ %.1f of the limit", outageDuring)) + "; " + note
		} else {
			note = "no goal: for contrast; " + note
		}
		t.row("  grants while Redis was away", fmt.Sprintf("%s (%.2f of the limit)", commas(r.During), float64(r.During)/max(r.Allowed, 1)), note)
		local := "none"
		if r.Local > 0 {
			local = fmt.Sprintf("the first returned at %s, the last at %s", secs(r.LocalFrom), secs(r.LocalTo))
		}
		t.row("  admitted by the local share", commas(r.Local), local)
		for _, w := range []OutageWindow{r.Sec, r.Tenth} {
			t.row("  busiest "+dur(w.Window)+" window", commas(w.Most)+" grants",
				fmt.Sprintf("%s; the bucket's promise for start times (%d + 200/s × %s) plus one capacity (%d) for the switch; at %s",
					t.goal(w.Most <= w.Bound, fmt.Sprintf("≤ %d", w.Bound)), outageCapacity, dur(w.Window+defaultMaxLateness+startSlack), outageCapacity, secs(w.At)))
		}
		t.row("  windows of every length", vsLimit(r.Excess),
			t.goal(r.Excess <= 0, "0 over")+"; the most grants in any window against the same bound (promise plus one capacity)")
		longest := "granted"
		if r.LongestErr != "" {
			longest = "failed: " + r.LongestErr
		}
		t.row("  longest call", dur(r.Longest),
			fmt.Sprintf("%s; it %s", t.goal(r.Longest <= o.Deadline+outageOverDeadline, "≤ the deadline + "+dur(outageOverDeadline)), longest))
		t.row("  rate after recovery", fmt.Sprintf("%.3f of the limit", r.Recovery),
			fmt.Sprintf("%s; %s grants from %s after the restart to the end (%s)",
				t.goal(r.RecoveryMet(), fmt.Sprintf("%.1f–%.2f", outageRecoveryLow, outageRecoveryHigh)), commas(r.RecoveryGrants), dur(outageSettle), dur(r.RecoverySpan)))
		t.row("  longest time without a grant", dur(r.Gap), fmt.Sprintf("from %s", secs(r.GapAt)))
		t.row("  calls", commas(r.Calls), fmt.Sprintf("%s granted, %s failed", commas(r.Grants), commas(r.FailedCalls())))
		for _, kind := range slices.Sorted(maps.Keys(r.Failed)) {
			t.row("    failed: "+kind, commas(r.Failed[kind]), "e.g. "+r.Example[kind])
		}
	}
}

// secs is an instant of a run, from its start, in seconds.
func secs(d time.Duration) string { return fmt.Sprintf("%.2f s", d.Seconds()) }

func (o *Outage) gobench(g *gobench) {
	for _, r := range o.Rows {
		g.line("Outage/fallback="+r.Fallback, r.Grants,
			r.During, "grants-away",
			f(float64(r.During)/max(r.Allowed, 1)), "away/limit",
			r.Sec.Most, "worst-1s",
			r.Tenth.Most, "worst-100ms",
			r.Excess, "excess",
			ms(r.Longest), "ms-longest-call",
			f(r.Recovery), "recovery/limit",
			ms(r.Gap), "ms-longest-gap",
			r.FailedCalls(), "failed")
	}
}

// outageSpec is one worker process's share of a run.
type outageSpec struct {
	Addr     string        `json:"addr"`
	Bucket   bucket.Config `json:"bucket"`
	Callers  int           `json:"callers"`
	Deadline time.Duration `json:"deadline"`
	Begin    int64         `json:"begin_unix_ns"` // the callers start then
	Until    int64         `json:"until_unix_ns"` // and their calls are cut then
}

// outageResult is what a worker process reports.
type outageResult struct {
	// Grants are when each granted Enter returned, unix ns: the host's
	// clock, common to the processes.
	Grants     []int64           `json:"grants"`
	Calls      int               `json:"calls"`
	Local      int               `json:"local"`
	LocalFrom  int64             `json:"local_from,omitempty"` // unix ns of the first local grant
	LocalTo    int64             `json:"local_to,omitempty"`   // and of the last
	Longest    time.Duration     `json:"longest"`
	LongestErr string            `json:"longest_err,omitempty"`
	Failed     map[string]int    `json:"failed"`
	Example    map[string]string `json:"example"`
}

// quiet drops go-redis's log lines: its dial failures while Redis is away
// would fill the worker's stderr.
type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// outageWorker is one worker process: its callers loop Enter, each with
// the spec's deadline, from the spec's start to its end, and it writes an
// outageResult to stdout.
func outageWorker(raw string) error {
	var spec outageSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		return err
	}
	redis.SetLogger(quiet{})
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rdb := client(&redis.Options{Addr: spec.Addr}, spec.Callers)
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil { // connect before the start
		return err
	}
	b, err := bucket.New(rdb, spec.Bucket)
	if err != nil {
		return err
	}
	defer b.Close()
	if err := sleepUntil(ctx, time.Unix(0, spec.Begin)); err != nil {
		return err
	}
	// Calls still waiting at the end are cut: the run is over.
	runCtx, cancel := context.WithDeadline(ctx, time.Unix(0, spec.Until))
	defer cancel()
	var (
		mu  sync.Mutex
		res = outageResult{Failed: map[string]int{}, Example: map[string]string{}}
		wg  sync.WaitGroup
	)
	for range spec.Callers {
		wg.Go(func() {
			for runCtx.Err() == nil {
				callCtx, cancel := context.WithTimeout(runCtx, spec.Deadline)
				start := time.Now()
				rep, err := b.EnterReport(callCtx)
				end := time.Now()
				cancel()
				cut := err != nil && runCtx.Err() != nil // by the end of the run, not a failure
				mu.Lock()
				res.Calls++
				if d := end.Sub(start); d > res.Longest {
					res.Longest, res.LongestErr = d, ""
					if err != nil {
						res.LongestErr = outageErrKind(err)
					}
				}
				switch {
				case err == nil:
					res.Grants = append(res.Grants, end.UnixNano())
					if rep.Local {
						if res.Local++; res.Local == 1 {
							res.LocalFrom = end.UnixNano()
						}
						res.LocalTo = max(res.LocalTo, end.UnixNano())
					}
				case cut:
					res.Calls--
				default:
					kind := outageErrKind(err)
					if res.Failed[kind]++; res.Failed[kind] == 1 {
						res.Example[kind] = err.Error()
					}
				}
				mu.Unlock()
				if err != nil && !cut {
					sleepUntil(runCtx, time.Now().Add(outagePause))
				}
			}
		})
	}
	wg.Wait()
	return json.NewEncoder(os.Stdout).Encode(res)
}

// outageErrKind names what made a call fail, in a user's words.
func outageErrKind(err error) string {
	var words []string
	if errors.Is(err, context.DeadlineExceeded) {
		words = append(words, "deadline passed")
	}
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		words = append(words, "connection refused")
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed), errors.Is(err, syscall.ECONNRESET):
		words = append(words, "connection cut")
	case errors.Is(err, rediscall.ErrNoAnswer):
		words = append(words, "no answer from Redis")
	case errors.Is(err, sluice.ErrLimited):
		words = append(words, "refused by the bucket")
	case len(words) == 0:
		words = append(words, "other")
	}
	return strings.Join(words, ", ")
}
