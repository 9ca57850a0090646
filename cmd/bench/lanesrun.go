package main

import (
	"cmp"
	"context"
	"encoding/json"
	"os"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/bench/workers"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
)

// The worker processes of the lanes scenario: each makes the bucket and
// runs groups of callers, each group in a lane, through loadgen.Run.

const lanesEnv = "SLUICE_BENCH_LANES"

func init() { workers.Serve(lanesEnv, "lanes worker", lanesWorker) }

// lanesSpec is one worker process's callers in a case.
type lanesSpec struct {
	workerTarget
	Bucket bucket.Config `json:"bucket"`
	Begin  int64         `json:"begin_unix_ns"` // the groups' times count from then
	End    int64         `json:"end_unix_ns"`   // the Enters still waiting are cancelled then
	Groups []lanesGroup  `json:"groups"`
}

// lanesGroup is callers in a lane. Each loops on Enter (or enters
// Enters times) from its arrival on: the first arrives At after the
// spec's Begin, the others spread evenly over Spread. At Cut after Begin
// (0: the spec's End) the group's Enters still waiting are cancelled.
type lanesGroup struct {
	Lane    string `json:"lane"`
	Callers int    `json:"callers"`
	// Own makes each caller a lane of its own: Lane followed by First
	// plus its index ("t" and First 5: "t5", "t6", ...).
	Own    bool          `json:"own,omitempty"`
	First  int           `json:"first,omitempty"`
	At     time.Duration `json:"at,omitempty"`
	Spread time.Duration `json:"spread,omitempty"`
	Enters int           `json:"enters,omitempty"`
	Cut    time.Duration `json:"cut,omitempty"`
}

// lanesResult is what a worker reports: each grant's group, slot (unix
// µs, Redis clock), wait (ns, the Enter's call to its return) and its
// retimes and claims (loadgen.Grant's), and the Enters that failed
// before they were cancelled.
type lanesResult struct {
	Grants [][4]int64 `json:"grants"`
	Errors int        `json:"errors"`
	Err    string     `json:"first_error,omitempty"`
}

// lanesRecord is one grant.
type lanesRecord struct {
	Lane string // for a group of Own lanes, their prefix
	Slot time.Time
	Wait time.Duration
	Late int // retimed or claimed
}

// runLanes runs procs[i]'s groups in the i-th worker process on a bucket
// of cfg, from lanesStartup from now to end after that, and returns the
// grants in order of slot, the errors, and the excess of the grants over
// the limit. during, when set, runs meanwhile with the instant the
// groups' times count from, and a ctx that ends when the workers have
// (it should be done by then).
func runLanes(ctx context.Context, e *env, cfg bucket.Config, procs [][]lanesGroup, end time.Duration, during func(ctx context.Context, begin time.Time)) ([]lanesRecord, lanesRun, error) {
	begin := time.Now().Add(lanesStartup)
	specs := make([]lanesSpec, len(procs))
	for i, gs := range procs {
		specs[i] = lanesSpec{workerTarget: e.workers(), Bucket: cfg, Begin: begin.UnixNano(), End: begin.Add(end).UnixNano(), Groups: gs}
	}
	var wg sync.WaitGroup
	dctx, stop := context.WithCancel(ctx)
	if during != nil {
		wg.Go(func() { during(dctx, begin) })
	}
	results, err := workers.Run[lanesSpec, lanesResult](ctx, lanesEnv, specs)
	stop()
	wg.Wait()
	var run lanesRun
	if err != nil {
		return nil, run, err
	}
	var recs []lanesRecord
	var slots []time.Time
	for i, r := range results {
		run.Errors += r.Errors
		run.Err = cmp.Or(run.Err, r.Err)
		for _, g := range r.Grants {
			rec := lanesRecord{Lane: procs[i][g[0]].Lane, Slot: time.UnixMicro(g[1]), Wait: time.Duration(g[2]), Late: int(g[3])}
			recs, slots = append(recs, rec), append(slots, rec.Slot)
		}
	}
	slices.SortFunc(recs, func(a, b lanesRecord) int { return a.Slot.Compare(b.Slot) })
	run.Grants = len(recs)
	run.Excess = guarantee.Check(slots, lanesLimit).Excess
	return recs, run, nil
}

// lanesWorker is one worker process: it runs its spec's groups and writes
// a lanesResult to stdout.
func lanesWorker(raw string) error {
	var spec lanesSpec
	ctx, stop, opt, err := openWorker(raw, &spec)
	if err != nil {
		return err
	}
	defer stop()
	callers := 0
	for _, g := range spec.Groups {
		callers += g.Callers
	}
	rdb := client(opt, min(callers, lanesPool))
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil { // connect before the start
		return err
	}
	b, err := bucket.New(rdb, spec.Bucket)
	if err != nil {
		return err
	}
	defer b.Close()
	// Cancelled, not a deadline: a deadline would refuse at once the
	// callers whose turn comes after it.
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	defer time.AfterFunc(time.Until(time.Unix(0, spec.End)), cancel).Stop()
	return json.NewEncoder(os.Stdout).Encode(runGroups(runCtx, b, time.Unix(0, spec.Begin), spec.Groups))
}

// runGroups runs groups' callers on b, their times counted from begin,
// until ctx ends, and returns what they did.
func runGroups(ctx context.Context, b *bucket.Bucket, begin time.Time, groups []lanesGroup) lanesResult {
	var (
		mu  sync.Mutex
		res lanesResult
		wg  sync.WaitGroup
	)
	for gi, g := range groups {
		gctx := ctx
		if g.Cut > 0 {
			var cut context.CancelFunc
			gctx, cut = context.WithCancel(ctx)
			defer time.AfterFunc(time.Until(begin.Add(g.Cut)), cut).Stop()
		}
		for c := range g.Callers {
			lane := g.Lane
			if g.Own {
				lane += strconv.Itoa(g.First + c)
			}
			at := begin.Add(g.At + g.Spread*time.Duration(c)/time.Duration(g.Callers))
			wg.Go(func() {
				if sleepUntil(gctx, at) != nil {
					return
				}
				loadgen.Run(gctx, b, loadgen.Spec{Proc: gi, Callers: 1, Enters: g.Enters, Lane: lane}, func(lg loadgen.Grant) {
					mu.Lock()
					defer mu.Unlock()
					switch {
					case lg.OK() && lg.Slot != 0:
						res.Grants = append(res.Grants, [4]int64{int64(gi), lg.Slot, lg.End - lg.Start, int64(lg.Retimes + lg.Claims)})
					case gctx.Err() == nil: // not cancelled at the end
						res.Errors++
						res.Err = cmp.Or(res.Err, lg.Err, "granted without a slot")
					}
				})
			})
		}
	}
	wg.Wait()
	return res
}

// lanesConfig is the bucket of every case, with lanes.
func lanesConfig(name string, lanes ...bucket.Lane) bucket.Config {
	return bucket.Config{Name: name, Capacity: lanesLimit.Capacity, RefillAmount: lanesLimit.RefillAmount,
		RefillFrequency: lanesLimit.RefillFrequency, Lanes: lanes}
}

func lanesRate() float64 {
	return float64(lanesLimit.RefillAmount) / lanesLimit.RefillFrequency.Seconds()
}

// spread gives each of procs processes its share of n callers of g.
func spread(procs [][]lanesGroup, n int, g lanesGroup) {
	for i := range procs {
		if g.Callers = share(n, len(procs), i); g.Callers > 0 {
			procs[i] = append(procs[i], g)
		}
	}
}

// takeover is from last to the start of the first window of w, starting
// at last or at a time in ts (sorted) after it and ending by end, that
// holds at least want of ts; -1 when there is none.
func takeover(ts []time.Time, last, end time.Time, w time.Duration, want float64) time.Duration {
	i, _ := slices.BinarySearchFunc(ts, last, time.Time.Compare)
	for start := last; !start.Add(w).After(end); i++ {
		j, _ := slices.BinarySearchFunc(ts, start.Add(w), time.Time.Compare)
		k, _ := slices.BinarySearchFunc(ts, start, time.Time.Compare)
		if float64(j-k) >= want {
			return start.Sub(last)
		}
		if i >= len(ts) {
			break
		}
		start = later(ts[i], last.Add(time.Nanosecond))
	}
	return -1
}

// pingRTT is the median of 20 PINGs.
func pingRTT(ctx context.Context, e *env) (time.Duration, error) {
	rdb := client(e.opt, 1)
	defer rdb.Close()
	var ds []time.Duration
	for range 21 { // the first connects
		start := time.Now()
		if err := rdb.Ping(ctx).Err(); err != nil {
			return 0, err
		}
		ds = append(ds, time.Since(start))
	}
	return distOf(ds[1:]).P50, nil
}
