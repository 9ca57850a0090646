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
)

// Result holds the figures of one Run.
type Result struct {
	Clients int `json:"clients"`

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
	Window      time.Duration `json:"window_ns"`    // measured part of the run
	Holds       int           `json:"holds"`        // holds started in the window
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
	run := fmt.Sprintf("%s-%08x", opt.Name, rand.Uint32())
	if err := burst(ctx, clients[0], run+"-burst", opt, &r); err != nil {
		return r, err
	}
	if err := saturate(ctx, clients, run+"-saturated", opt, &r); err != nil {
		return r, err
	}
	return r, nil
}

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
	sems := make([]*semaphore.Semaphore, len(clients))
	for i, c := range clients {
		s, err := semaphore.New(c, opt.config(name, opt.Capacity))
		if err != nil {
			return err
		}
		defer s.Close()
		sems[i] = s
	}
	type span struct {
		wait       time.Duration
		start, end time.Time
	}
	runCtx, cancel := context.WithTimeout(ctx, opt.Duration)
	defer cancel()
	begin := time.Now()
	var mu sync.Mutex
	var holds []span
	var lost, failures int
	var wg sync.WaitGroup
	sleepers := make([]*sleeper, opt.Callers)
	for c := range sleepers {
		sl, err := newSleeper()
		if err != nil {
			return err
		}
		defer sl.Close()
		sleepers[c] = sl
	}
	for c := range opt.Callers {
		s, sl := sems[c%len(sems)], sleepers[c]
		wg.Go(func() {
			var mine []span
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
				mine = append(mine, span{start.Sub(asked), start, end})
			}
			mu.Lock()
			holds = append(holds, mine...)
			lost += myLost
			failures += myErr
			mu.Unlock()
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return err
	}

	from, to := begin.Add(opt.Warmup), begin.Add(opt.Duration)
	var waits []time.Duration
	var held time.Duration
	ivs := make([][2]time.Time, 0, len(holds))
	for _, h := range holds {
		ivs = append(ivs, [2]time.Time{h.start, h.end})
		if !h.start.Before(from) && h.start.Before(to) {
			r.Holds++
			waits = append(waits, h.wait)
			held += h.end.Sub(h.start)
		}
	}
	if r.Holds > 0 {
		r.HoldMean = held / time.Duration(r.Holds)
		r.Handoff = time.Duration(opt.Capacity)*(to.Sub(from))/time.Duration(r.Holds) - r.HoldMean
	}
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
	r.Lost, r.Errors = lost, failures
	return nil
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
