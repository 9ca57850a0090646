// Package semabench is the reusable performance scenario of package
// semaphore: how fast a burst of acquires is served, how fully a saturated
// semaphore is used, how long callers wait compared with a perfect FIFO
// semaphore, and whether the capacity was ever exceeded. cmd/bench runs it
// as scenario "semaphore"; the package's own test runs it on a local
// redis-server.
//
// Each client given to Run stands for one process: it gets its own
// Semaphore (own process id, own wake-up subscription).
package semabench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/semaphore"
)

// Options configures Run. The zero value of each field picks the default
// in brackets.
type Options struct {
	Name        string        // semaphore name prefix ["semabench"]; a random suffix keeps runs apart
	Burst       int           // concurrent acquires in one process, capacity to spare [100]
	BurstRounds int           // bursts measured [20]
	Capacity    int           // permits in the saturated run [10]
	Hold        time.Duration // how long each caller holds a permit [5ms]
	Callers     int           // callers spread over the clients [100]
	Duration    time.Duration // length of the saturated run [3s]
	Warmup      time.Duration // start of the saturated run left out of the figures [300ms]
	LeaseTTL    time.Duration // semaphore.Config.LeaseTTL [its default]
	QueueTTL    time.Duration // semaphore.Config.QueueTTL [its default]
}

// Goals the figures are held to.
const (
	GoalBurst       = 1500 * time.Microsecond // burst served within
	GoalUtilization = 0.90                    // of Capacity/Hold holds per second
	GoalWaitSlack   = 10 * time.Millisecond   // wait p99 above the ideal FIFO wait
	GoalHandoffP50  = time.Millisecond        // a release to the next holder's start, median
	GoalHandoffP99  = 5 * time.Millisecond    // the same, 99th percentile
)

// Result holds the figures of one Run.
type Result struct {
	Clients   int `json:"clients"`
	Processes int `json:"processes"` // OS processes the saturated run's clients ran in (RunProcs); 0: this one

	// Burst: Burst concurrent Acquire calls in one process with capacity
	// to spare, from release of the callers to the last grant.
	Burst       int           `json:"burst"`
	BurstMedian time.Duration `json:"burst_median_ns"`
	BurstMax    time.Duration `json:"burst_max_ns"`

	// Saturated run: Callers callers over Clients clients loop acquire,
	// hold Hold, release, on a semaphore of Capacity permits.
	Capacity    int           `json:"capacity"`
	Callers     int           `json:"callers"`
	Hold        time.Duration `json:"hold_ns"`
	HoldMean    time.Duration `json:"hold_mean_ns"` // holds as measured: sleeping overshoots Hold
	Handoff     time.Duration `json:"handoff_ns"`   // mean time a permit sat unused between holds
	HandoffP50  time.Duration `json:"handoff_p50_ns"`
	HandoffP99  time.Duration `json:"handoff_p99_ns"` // a release to the start of the hold it made room for
	Window      time.Duration `json:"window_ns"`      // measured part of the run
	Holds       int           `json:"holds"`          // holds started in the window
	HoldsPerSec float64       `json:"holds_per_s"`
	Possible    float64       `json:"possible_per_s"` // Capacity/Hold: holds per second of a perfect semaphore
	Utilization float64       `json:"utilization"`    // HoldsPerSec/Possible
	WaitP50     time.Duration `json:"wait_p50_ns"`
	WaitP99     time.Duration `json:"wait_p99_ns"`
	WaitIdeal   time.Duration `json:"wait_ideal_ns"` // every caller's wait in a perfect FIFO semaphore

	// Check over every interval of the saturated run.
	Intervals  int `json:"intervals"`
	Peak       int `json:"peak"`       // most holders at one instant
	Violations int `json:"violations"` // acquisitions that took the holders above Capacity
	Lost       int `json:"lost"`       // leases lost during the run (should be 0)
	Errors     int `json:"errors"`     // failed Acquire or Release calls
}

// Row is one line of the result table.
type Row struct {
	Metric, Value, Goal string
	OK                  bool
}

// Rows is the result as a table, goals alongside.
func (r Result) Rows() []Row {
	ms := func(d time.Duration) string { return fmt.Sprintf("%.3f ms", float64(d)/float64(time.Millisecond)) }
	return []Row{
		{fmt.Sprintf("burst of %d acquires, 1 client, median", r.Burst), ms(r.BurstMedian), "≤ " + ms(GoalBurst), r.BurstMedian <= GoalBurst},
		{fmt.Sprintf("burst of %d acquires, 1 client, max", r.Burst), ms(r.BurstMax), "", true},
		{fmt.Sprintf("holds/s (%d permits, %v holds, %d callers, %d clients)", r.Capacity, r.Hold, r.Callers, r.Clients),
			fmt.Sprintf("%.0f of %.0f", r.HoldsPerSec, r.Possible), "", true},
		{"mean hold as slept, mean handoff gap", ms(r.HoldMean) + ", " + ms(r.Handoff), "", true},
		{"a release to the next holder's start, p50", ms(r.HandoffP50), "≤ " + ms(GoalHandoffP50), r.HandoffP50 <= GoalHandoffP50},
		{"a release to the next holder's start, p99", ms(r.HandoffP99), "≤ " + ms(GoalHandoffP99), r.HandoffP99 <= GoalHandoffP99},
		{"utilization", fmt.Sprintf("%.1f%%", 100*r.Utilization), fmt.Sprintf("≥ %.0f%%", 100*GoalUtilization), r.Utilization >= GoalUtilization},
		{"wait p50", ms(r.WaitP50), "", true},
		{"wait p99 (ideal FIFO " + ms(r.WaitIdeal) + ")", ms(r.WaitP99), "≤ " + ms(r.WaitIdeal+GoalWaitSlack), r.WaitP99 <= r.WaitIdeal+GoalWaitSlack},
		{fmt.Sprintf("holders above capacity (%d intervals, peak %d)", r.Intervals, r.Peak), fmt.Sprint(r.Violations), "0", r.Violations == 0},
		{"leases lost, errors", fmt.Sprintf("%d, %d", r.Lost, r.Errors), "0, 0", r.Lost == 0 && r.Errors == 0},
	}
}

// OK reports whether every goal was met.
func (r Result) OK() bool {
	for _, row := range r.Rows() {
		if !row.OK {
			return false
		}
	}
	return true
}

// String is the result table for people.
func (r Result) String() string {
	var b strings.Builder
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "metric\tvalue\tgoal\t")
	for _, row := range r.Rows() {
		mark := ""
		if row.Goal != "" {
			mark = "ok"
			if !row.OK {
				mark = "MISSED"
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s %s\t\n", row.Metric, row.Value, row.Goal, mark)
	}
	tw.Flush()
	return b.String()
}

func (o Options) withDefaults() Options {
	def := func(v *int, d int) {
		if *v <= 0 {
			*v = d
		}
	}
	defD := func(v *time.Duration, d time.Duration) {
		if *v <= 0 {
			*v = d
		}
	}
	if o.Name == "" {
		o.Name = "semabench"
	}
	def(&o.Burst, 100)
	def(&o.BurstRounds, 20)
	def(&o.Capacity, 10)
	def(&o.Callers, 100)
	defD(&o.Hold, 5*time.Millisecond)
	defD(&o.Duration, 3*time.Second)
	if o.Warmup <= 0 {
		o.Warmup = min(300*time.Millisecond, o.Duration/4)
	}
	return o
}

// Run measures the scenario on clients (at least one; each stands for one
// process) and returns the figures. It fails only if it cannot run (no
// client, a Semaphore that cannot be made, the burst failing, ctx ended);
// missed goals are in the Result.
func Run(ctx context.Context, clients []redis.UniversalClient, opt Options) (Result, error) {
	if len(clients) == 0 {
		return Result{}, errors.New("semabench: no clients")
	}
	opt = opt.withDefaults()
	r := Result{Clients: len(clients), Burst: opt.Burst}
	run := fmt.Sprintf("%s-%08x", opt.Name, randSuffix())
	if err := burst(ctx, clients[0], run+"-burst", opt, &r); err != nil {
		return r, err
	}
	if err := saturate(ctx, clients, run+"-saturated", opt, &r); err != nil {
		return r, err
	}
	return r, nil
}

func randSuffix() uint32 { return rand.Uint32() }

func (o Options) config(name string, capacity int) semaphore.Config {
	return semaphore.Config{Name: name, Capacity: capacity, LeaseTTL: o.LeaseTTL, QueueTTL: o.QueueTTL}
}

// burst times opt.Burst simultaneous Acquire calls on one Semaphore with
// capacity to spare.
func burst(ctx context.Context, rdb redis.UniversalClient, name string, opt Options, r *Result) error {
	s, err := semaphore.New(rdb, opt.config(name, 2*opt.Burst))
	if err != nil {
		return err
	}
	defer s.Close()
	var times []time.Duration
	for round := -1; round < opt.BurstRounds; round++ { // round -1 warms up
		gate := make(chan struct{})
		permits := make([]*semaphore.Permit, opt.Burst)
		errs := make([]error, opt.Burst)
		var ready, done sync.WaitGroup
		for i := range opt.Burst {
			ready.Add(1)
			done.Add(1)
			go func() {
				defer done.Done()
				ready.Done()
				<-gate
				permits[i], errs[i] = s.Acquire(ctx)
			}()
		}
		ready.Wait()
		start := time.Now()
		close(gate)
		done.Wait()
		took := time.Since(start)
		for i, p := range permits {
			if errs[i] != nil {
				return fmt.Errorf("semabench: burst: %w", errs[i])
			}
			if err := p.Release(ctx); err != nil {
				return fmt.Errorf("semabench: burst release: %w", err)
			}
		}
		if round >= 0 {
			times = append(times, took)
		}
	}
	slices.Sort(times)
	r.BurstMedian, r.BurstMax = times[len(times)/2], times[len(times)-1]
	return nil
}

// saturate runs opt.Callers callers over one Semaphore per client.
func saturate(ctx context.Context, clients []redis.UniversalClient, name string, opt Options, r *Result) error {
	begin := time.Now()
	until := begin.Add(opt.Duration)
	var mu sync.Mutex
	var all Spans
	errs := make([]error, len(clients))
	var wg sync.WaitGroup
	for i, c := range clients {
		n := opt.Callers / len(clients)
		if i < opt.Callers%len(clients) {
			n++
		}
		wg.Go(func() {
			sp, err := Callers(ctx, c, name, opt, n, until)
			mu.Lock()
			all.Holds = append(all.Holds, sp.Holds...)
			all.Lost += sp.Lost
			all.Errors += sp.Errors
			mu.Unlock()
			errs[i] = err
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	Judge(r, all, begin, opt)
	return nil
}

// Hold is one permit held in the saturated run: asked is when Acquire was
// called, start when it returned, end before Release. Times are the
// machine's wall clock, shared by every process on it.
type Hold struct {
	Asked time.Time `json:"asked"`
	Start time.Time `json:"start"`
	End   time.Time `json:"end"`
}

// Spans is what the callers of one process (or all) saw.
type Spans struct {
	Holds  []Hold `json:"holds"`
	Lost   int    `json:"lost"`
	Errors int    `json:"errors"`
}

// Callers runs n callers of the saturated run on one Semaphore on rdb
// (one process's share) until until, and returns what they saw. Run calls
// it once per client; cmd/bench calls it in each of its worker processes.
func Callers(ctx context.Context, rdb redis.UniversalClient, name string, opt Options, n int, until time.Time) (Spans, error) {
	opt = opt.withDefaults()
	s, err := semaphore.New(rdb, opt.config(name, opt.Capacity))
	if err != nil {
		return Spans{}, err
	}
	defer s.Close()
	runCtx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	sleepers := make([]*sleeper, n)
	for c := range sleepers {
		sl, err := newSleeper()
		if err != nil {
			return Spans{}, err
		}
		defer sl.Close()
		sleepers[c] = sl
	}
	var mu sync.Mutex
	var out Spans
	var wg sync.WaitGroup
	for _, sl := range sleepers {
		wg.Go(func() {
			var mine []Hold
			myLost, myErr := 0, 0
			for runCtx.Err() == nil {
				asked := time.Now()
				p, err := s.Acquire(runCtx)
				if err != nil {
					if runCtx.Err() == nil {
						myErr++
					}
					break
				}
				start := time.Now()
				if err := sl.hold(opt.Hold); err != nil {
					myErr++
				}
				end := time.Now()
				select {
				case <-p.Lost():
					myLost++
				default:
				}
				if err := p.Release(context.WithoutCancel(ctx)); err != nil {
					if errors.Is(err, semaphore.ErrLeaseLost) {
						myLost++
					} else {
						myErr++
					}
				}
				mine = append(mine, Hold{asked, start, end})
			}
			mu.Lock()
			out.Holds = append(out.Holds, mine...)
			out.Lost += myLost
			out.Errors += myErr
			mu.Unlock()
		})
	}
	wg.Wait()
	return out, ctx.Err()
}

// Judge fills r's saturated-run figures from every process's spans, the
// run having begun at begin.
func Judge(r *Result, all Spans, begin time.Time, opt Options) {
	opt = opt.withDefaults()
	from, to := begin.Add(opt.Warmup), begin.Add(opt.Duration)
	var waits []time.Duration
	var held time.Duration
	ivs := make([][2]time.Time, 0, len(all.Holds))
	for _, h := range all.Holds {
		ivs = append(ivs, [2]time.Time{h.Start, h.End})
		if !h.Start.Before(from) && h.Start.Before(to) {
			r.Holds++
			waits = append(waits, h.Start.Sub(h.Asked))
			held += h.End.Sub(h.Start)
		}
	}
	if r.Holds > 0 {
		r.HoldMean = held / time.Duration(r.Holds)
		r.Handoff = time.Duration(opt.Capacity)*(to.Sub(from))/time.Duration(r.Holds) - r.HoldMean
	}
	gaps := Handoffs(ivs, from, to)
	slices.Sort(gaps)
	r.HandoffP50, r.HandoffP99 = quantile(gaps, 0.50), quantile(gaps, 0.99)
	r.Capacity, r.Callers, r.Hold = opt.Capacity, opt.Callers, opt.Hold
	r.Window = to.Sub(from)
	r.HoldsPerSec = float64(r.Holds) / r.Window.Seconds()
	r.Possible = float64(opt.Capacity) / opt.Hold.Seconds()
	r.Utilization = r.HoldsPerSec / r.Possible
	if opt.Callers > opt.Capacity {
		r.WaitIdeal = time.Duration(opt.Callers-opt.Capacity) * opt.Hold / time.Duration(opt.Capacity)
	}
	slices.Sort(waits)
	r.WaitP50, r.WaitP99 = quantile(waits, 0.50), quantile(waits, 0.99)
	r.Intervals = len(ivs)
	r.Peak, r.Violations = Overlap(ivs, opt.Capacity)
	r.Lost, r.Errors = all.Lost, all.Errors
}

// Handoffs pairs each hold starting in [from, to) with the earliest
// release not yet paired that precedes it (the place it got, on a
// saturated semaphore where someone always waits) and returns the gaps
// between them. A start with no earlier release free found a place no one
// had just left, and is left out.
func Handoffs(ivs [][2]time.Time, from, to time.Time) []time.Duration {
	starts := make([]time.Time, 0, len(ivs))
	ends := make([]time.Time, 0, len(ivs))
	for _, iv := range ivs {
		starts = append(starts, iv[0])
		ends = append(ends, iv[1])
	}
	slices.SortFunc(starts, func(a, b time.Time) int { return a.Compare(b) })
	slices.SortFunc(ends, func(a, b time.Time) int { return a.Compare(b) })
	var gaps []time.Duration
	next := 0 // the earliest release not yet paired
	for _, st := range starts {
		if next < len(ends) && !ends[next].After(st) {
			if !st.Before(from) && st.Before(to) {
				gaps = append(gaps, st.Sub(ends[next]))
			}
			next++
		}
	}
	return gaps
}

func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, int(q*float64(len(sorted))))]
}

// Overlap checks intervals [start, end] against capacity: it returns the
// most intervals open at one instant and how many starts went above
// capacity. An interval ending at the instant another starts does not
// overlap it.
func Overlap(ivs [][2]time.Time, capacity int) (peak, violations int) {
	type edge struct {
		t time.Time
		d int
	}
	edges := make([]edge, 0, 2*len(ivs))
	for _, iv := range ivs {
		edges = append(edges, edge{iv[0], +1}, edge{iv[1], -1})
	}
	sort.Slice(edges, func(i, j int) bool {
		if !edges[i].t.Equal(edges[j].t) {
			return edges[i].t.Before(edges[j].t)
		}
		return edges[i].d < edges[j].d
	})
	n := 0
	for _, e := range edges {
		n += e.d
		peak = max(peak, n)
		if e.d > 0 && n > capacity {
			violations++
		}
	}
	return peak, violations
}
