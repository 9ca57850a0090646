package main

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/enterdetail"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
	"github.com/sluicehq/sluice/semaphore"
)

// Tenants is many quotas in one process: a SaaS that calls an API for
// thousands of customers, each with a limit of its own, makes a bucket
// per customer (and some semaphores) on one go-redis client, sends each
// a burst of callers, then sits idle. What does a handle cost while it
// waits for work, and does the burst still finish near the limit?
type Tenants struct {
	Buckets    int `json:"buckets"`
	Semaphores int `json:"semaphores"`
	// Pool is --tenants-pool: the client's PoolSize, 0 for go-redis's
	// default (10 a GOMAXPROCS).
	Pool     int           `json:"pool_flag"`
	Deadline time.Duration `json:"deadline_ns"` // of each caller
	Idle     time.Duration `json:"idle_ns"`     // the window Redis's commands are counted over
	Rows     []TenantsRow  `json:"rows"`

	callers string // --tenants-callers
}

// TenantsRow is one run: every handle gets Callers callers at once.
type TenantsRow struct {
	Callers int `json:"callers_per_handle"`
	Pool    int `json:"pool"` // the client's pool size in force

	// The buckets' callers: granted or not within the deadline.
	BucketCallers int    `json:"bucket_callers"`
	Granted       int    `json:"granted"`
	Errors        int    `json:"errors"`
	Err           string `json:"first_error,omitempty"`
	// LastGrant is from the burst's first call to Enter to the last
	// return of a granted one; Ideal the same for a perfect FIFO queue of
	// each bucket's limit given the same calls (fifoGrants).
	LastGrant time.Duration `json:"last_grant_ns"`
	Ideal     time.Duration `json:"ideal_ns"`
	// Reentries sums Report.Reentries over every caller, granted or not:
	// the times one queued again at the back (its slot lost, or a live
	// change). Retimes and Refunds sum Report.Retimes and Refunds: the
	// times one came later than MaxLateness and took the next slot, and
	// how many of those missed slots' tokens went back to its bucket.
	Reentries int `json:"reentries"`
	Retimes   int `json:"retimes"`
	Refunds   int `json:"refunds"`
	// ExcessSlots and ExcessStarts are the worst bucket's busiest window
	// against its limit, by slot and by start (windows MaxLateness + 2 ms
	// longer): ≤ 0 when every bucket held its limit.
	ExcessSlots  int `json:"excess_slots"`
	ExcessStarts int `json:"excess_starts_slack"`

	// The semaphores' callers: each acquires, holds the permit
	// tenantsHold and releases it.
	SemaphoreCallers int           `json:"semaphore_callers"`
	Acquired         int           `json:"acquired"`
	SemaphoreErrors  int           `json:"semaphore_errors"`
	LastAcquire      time.Duration `json:"last_acquire_ns"`
	// MostHeld is the most permits of one semaphore held at once, by
	// this process's clock (acquire's return to release's call): at most
	// its capacity when the semaphore kept its promise.
	MostHeld int `json:"most_held"`

	// This client's connections to Redis (CLIENT LIST, by client name):
	// the most sampled from the burst to the idle window, and idle.
	ConnsPeak       int `json:"conns_peak"`
	ConnsIdle       int `json:"conns_idle"`
	ConnsAfterClose int `json:"conns_after_close"`
	// Goroutines are this process's beyond those it ran before the client
	// was made.
	GoroutinesPeak       int `json:"goroutines_peak"`
	GoroutinesIdle       int `json:"goroutines_idle"`
	GoroutinesAfterClose int `json:"goroutines_after_close"`
	// HeapIdle is the live heap (after a GC) idle, less the one before
	// the handles were made; HeapPerHandle divides it by the handles.
	HeapIdle      int64   `json:"heap_idle_bytes"`
	HeapPerHandle float64 `json:"heap_per_handle_bytes"`
	// CommandsPerSec is what Redis processed a second over the idle
	// window (INFO total_commands_processed), the probe's own left out.
	CommandsPerSec float64 `json:"commands_per_s_idle"`
	// Close is how long closing every handle took, one after another.
	Close time.Duration `json:"close_ns"`
}

// The limits of the tenants scenario: every bucket 5/s with a burst of 1
// (Capacity 1, 1 token every 200 ms), every semaphore 1 permit held
// 20 ms by each caller.
var tenantsPolicy = bucket.Rate(5, time.Second, 1)

const (
	tenantsPermits = 1
	tenantsHold    = 20 * time.Millisecond
	// tenantsSettle is how long after the burst's last caller returned the
	// process counts as idle.
	tenantsSettle = time.Second
	// tenantsSample is how often connections are counted during the burst.
	tenantsSample = 250 * time.Millisecond
)

// The goals of the tenants scenario.
const (
	tenantsConnsOver     = 2     // connections ≤ pool + this
	tenantsGoroutines    = 50    // idle, whatever the count of handles
	tenantsHeapPerHandle = 10240 // bytes
	tenantsCommandsIdle  = 5.0   // a second
	tenantsLightRatio    = 1.5   // last grant / ideal, up to tenantsLight callers a handle
	tenantsHeavyRatio    = 2.0   // above
	tenantsLight         = 3
	tenantsReentries     = 0.01 // of grants, above tenantsLight callers a handle
)

func (*Tenants) about() about {
	return about{name: "tenants", takes: "~12 s", all: true,
		what:  "2,000 buckets and 200 semaphores on one client, a burst of callers each, then idle: connections, goroutines, heap, Redis commands, time to the last grant",
		needs: "it counts this process's connections to Redis with CLIENT LIST, which miniredis does not have"}
}

func (t *Tenants) flags(fs *flag.FlagSet) {
	fs.IntVar(&t.Buckets, "tenants-buckets", 2000, "buckets on the one client, each its own name at 5/s, burst 1")
	fs.IntVar(&t.Semaphores, "tenants-semaphores", 200, "semaphores on the one client, 1 permit each")
	fs.StringVar(&t.callers, "tenants-callers", "3,8", "callers a handle at once, comma-separated: one run each")
	fs.IntVar(&t.Pool, "tenants-pool", 0, "the client's PoolSize (0: go-redis's default, 10 a GOMAXPROCS)")
	fs.DurationVar(&t.Deadline, "tenants-deadline", 15*time.Second, "each caller's deadline")
	fs.DurationVar(&t.Idle, "tenants-idle", 3*time.Second, "how long Redis's commands are counted while idle (go-redis pings each Pub/Sub connection every 3 s)")
}

func (t *Tenants) counts() ([]int, error) {
	var out []int
	for _, s := range strings.Split(strings.ReplaceAll(t.callers, " ", ""), ",") {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("--tenants-callers %q: want whole numbers ≥ 1, comma-separated", t.callers)
		}
		out = append(out, n)
	}
	return out, nil
}

func (t *Tenants) check() error {
	if _, err := t.counts(); err != nil {
		return err
	}
	switch {
	case t.Buckets < 1 || t.Semaphores < 0:
		return fmt.Errorf("--tenants-buckets %d, --tenants-semaphores %d: want ≥ 1 and ≥ 0", t.Buckets, t.Semaphores)
	case t.Pool < 0:
		return fmt.Errorf("--tenants-pool %d: want ≥ 0", t.Pool)
	case t.Deadline <= 0 || t.Idle <= 0:
		return fmt.Errorf("--tenants-deadline %v, --tenants-idle %v: want > 0", t.Deadline, t.Idle)
	}
	return nil
}

func (t *Tenants) run(ctx context.Context, e *env) error {
	counts, err := t.counts()
	if err != nil {
		return err
	}
	t.Rows = nil
	for _, n := range counts {
		r, err := t.runOne(ctx, e, n)
		if err != nil {
			return fmt.Errorf("%d callers a handle: %w", n, err)
		}
		t.Rows = append(t.Rows, r)
	}
	return nil
}

// runOne makes the handles on a fresh client, sends callers callers to
// each at once, lets the process go idle and measures it, then closes
// every handle.
func (t *Tenants) runOne(ctx context.Context, e *env, callers int) (TenantsRow, error) {
	r := TenantsRow{Callers: callers, BucketCallers: t.Buckets * callers, SemaphoreCallers: t.Semaphores * callers}
	name := fmt.Sprintf("%s-c%d", e.name, callers)
	opt := *e.opt
	opt.ContextTimeoutEnabled, opt.PoolSize, opt.ClientName = true, t.Pool, name
	r.Pool = t.Pool
	if r.Pool == 0 {
		r.Pool = 10 * runtime.GOMAXPROCS(0) // go-redis's default
	}
	e.logf("tenants: %d buckets (5/s, burst 1) and %d semaphores (%d permit) on one client (pool %d), %d callers each...",
		t.Buckets, t.Semaphores, tenantsPermits, r.Pool, callers)
	probe := client(e.opt, 1)
	defer probe.Close()
	var probeCmds loadgen.RoundTripCounter
	probe.AddHook(&probeCmds)
	if err := probe.Ping(ctx).Err(); err != nil {
		return r, err
	}

	// Everything the burst records is allocated before the heap's
	// baseline, so that the idle heap is what the handles keep.
	grants := make([]loadgen.Grant, r.BucketCallers)
	holds := make([]semHold, r.SemaphoreCallers)
	buckets := make([]*bucket.Bucket, 0, t.Buckets)
	sems := make([]*semaphore.Semaphore, 0, t.Semaphores)
	baseG := runtime.NumGoroutine()
	rdb := redis.NewClient(&opt)
	defer rdb.Close()
	heap0 := liveHeap()

	closeAll := func() {
		for _, b := range buckets {
			b.Close()
		}
		for _, s := range sems {
			s.Close()
		}
	}
	for i := range t.Buckets {
		b, err := bucket.New(rdb, bucket.Config{Name: fmt.Sprintf("%s-b%d", name, i),
			Capacity: tenantsPolicy.Capacity, RefillAmount: tenantsPolicy.RefillAmount, RefillFrequency: tenantsPolicy.RefillFrequency})
		if err != nil {
			closeAll()
			return r, err
		}
		buckets = append(buckets, b)
	}
	for i := range t.Semaphores {
		s, err := semaphore.New(rdb, semaphore.Config{Name: fmt.Sprintf("%s-s%d", name, i), Capacity: tenantsPermits})
		if err != nil {
			closeAll()
			return r, err
		}
		sems = append(sems, s)
	}

	// Count connections and goroutines while the burst runs.
	sampleCtx, stopSampling := context.WithCancel(ctx)
	var sampler sync.WaitGroup
	sampler.Go(func() {
		tick := time.NewTicker(tenantsSample)
		defer tick.Stop()
		for {
			if n, err := clientConns(sampleCtx, probe, name); err == nil {
				r.ConnsPeak = max(r.ConnsPeak, n)
			}
			r.GoroutinesPeak = max(r.GoroutinesPeak, runtime.NumGoroutine()-baseG)
			select {
			case <-sampleCtx.Done():
				return
			case <-tick.C:
			}
		}
	})

	var wg sync.WaitGroup
	begin := time.Now()
	for i, b := range buckets {
		for k := range callers {
			wg.Go(func() {
				cctx, cancel := context.WithTimeout(ctx, t.Deadline)
				defer cancel()
				start := time.Now()
				var d enterdetail.Detail
				rep, err := b.EnterReport(enterdetail.With(cctx, &d))
				g := loadgen.Grant{Proc: i, Caller: k, Ticket: rep.Ticket, Start: start.UnixNano(), End: time.Now().UnixNano(), Reentries: rep.Reentries, Retimes: rep.Retimes, Refunds: d.Refunds}
				if !d.Slot.IsZero() {
					g.Slot = d.Slot.UnixMicro()
				}
				if err != nil {
					g.Err = err.Error()
				}
				grants[i*callers+k] = g
			})
		}
	}
	for i, s := range sems {
		for k := range callers {
			wg.Go(func() {
				holds[i*callers+k] = holdPermit(ctx, s, t.Deadline)
			})
		}
	}
	wg.Wait()
	stopSampling()
	sampler.Wait()
	if err := ctx.Err(); err != nil {
		closeAll()
		return r, err
	}
	r.judgeBuckets(grants, callers, begin)
	r.judgeSemaphores(holds, callers, begin)

	// Idle: every caller has returned.
	if sleepCtx(ctx, tenantsSettle); ctx.Err() != nil {
		closeAll()
		return r, ctx.Err()
	}
	var err error
	if r.ConnsIdle, err = clientConns(ctx, probe, name); err != nil {
		closeAll()
		return r, err
	}
	r.ConnsPeak = max(r.ConnsPeak, r.ConnsIdle)
	r.GoroutinesIdle = runtime.NumGoroutine() - baseG
	r.HeapIdle = liveHeap() - heap0
	handles := len(buckets) + len(sems)
	r.HeapPerHandle = float64(r.HeapIdle) / float64(handles)
	if r.CommandsPerSec, err = commandsPerSec(ctx, probe, &probeCmds, t.Idle); err != nil {
		closeAll()
		return r, err
	}

	start := time.Now()
	closeAll()
	r.Close = time.Since(start)
	r.GoroutinesAfterClose = runtime.NumGoroutine() - baseG
	if r.ConnsAfterClose, err = clientConns(ctx, probe, name); err != nil {
		return r, err
	}
	runtime.KeepAlive(grants)
	runtime.KeepAlive(holds)
	return r, nil
}

// judgeBuckets finds the last grant, the ideal one, the re-entries and
// the worst bucket's excess.
func (r *TenantsRow) judgeBuckets(grants []loadgen.Grant, callers int, begin time.Time) {
	l := guarantee.Limit{Capacity: tenantsPolicy.Capacity, RefillAmount: tenantsPolicy.RefillAmount, RefillFrequency: tenantsPolicy.RefillFrequency}
	r.ExcessSlots, r.ExcessStarts = -1<<31, -1<<31
	for i := 0; i < len(grants); i += callers {
		var arrivals, slots, ends []time.Time
		for _, g := range grants[i : i+callers] {
			// The ideal serves every caller, granted or not.
			arrivals = append(arrivals, time.Unix(0, g.Start))
			r.Reentries += g.Reentries
			r.Retimes += g.Retimes
			r.Refunds += g.Refunds
			if !g.OK() {
				r.Errors++
				if r.Err == "" {
					r.Err = g.Err
				}
				continue
			}
			r.Granted++
			r.LastGrant = max(r.LastGrant, g.Time().Sub(begin))
			slots = append(slots, g.SlotTime())
			ends = append(ends, g.Time())
		}
		for _, at := range fifoGrants(arrivals, l) {
			r.Ideal = max(r.Ideal, at.Sub(begin))
		}
		r.ExcessSlots = max(r.ExcessSlots, guarantee.Check(slots, l).Excess)
		r.ExcessStarts = max(r.ExcessStarts, guarantee.CheckSlack(ends, l, defaultMaxLateness+startSlack).Excess)
	}
}

// semHold is one semaphore caller: when it acquired and when it began
// to release (unix ns), or its error.
type semHold struct {
	start, acquired, released int64
	err                       error
}

// holdPermit acquires a permit of s, holds it tenantsHold and releases it.
func holdPermit(ctx context.Context, s *semaphore.Semaphore, deadline time.Duration) semHold {
	cctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	h := semHold{start: time.Now().UnixNano()}
	p, err := s.Acquire(cctx)
	if err != nil {
		h.err = err
		return h
	}
	h.acquired = time.Now().UnixNano()
	time.Sleep(tenantsHold) // the work the permit guards
	h.released = time.Now().UnixNano()
	h.err = p.Release(cctx)
	return h
}

// judgeSemaphores finds the last acquire and the most permits of one
// semaphore held at once.
func (r *TenantsRow) judgeSemaphores(holds []semHold, callers int, begin time.Time) {
	for i := 0; i < len(holds); i += callers {
		type edge struct {
			at int64
			d  int
		}
		var edges []edge
		for _, h := range holds[i : i+callers] {
			if h.acquired == 0 {
				r.SemaphoreErrors++
				continue
			}
			if h.err != nil {
				r.SemaphoreErrors++ // the release failed
			}
			r.Acquired++
			r.LastAcquire = max(r.LastAcquire, time.Duration(h.acquired-begin.UnixNano()))
			edges = append(edges, edge{h.acquired, 1}, edge{h.released, -1})
		}
		// Releases first at equal instants: a hand-over is not an overlap.
		slices.SortFunc(edges, func(a, b edge) int {
			if a.at != b.at {
				return int(a.at - b.at)
			}
			return a.d - b.d
		})
		held := 0
		for _, e := range edges {
			held += e.d
			r.MostHeld = max(r.MostHeld, held)
		}
	}
}

// liveHeap is the heap in use after a full collection.
func liveHeap() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapAlloc)
}

// clientConns counts the connections Redis has open for clients named
// name.
func clientConns(ctx context.Context, probe *redis.Client, name string) (int, error) {
	list, err := probe.ClientList(ctx).Result()
	if err != nil {
		return 0, err
	}
	n := 0
	for _, line := range strings.Split(list, "\n") {
		if slices.Contains(strings.Fields(line), "name="+name) {
			n++
		}
	}
	return n, nil
}

// commandsPerSec is how many commands Redis processed a second over d,
// those probe sent left out (counted by its hook cmds).
func commandsPerSec(ctx context.Context, probe *redis.Client, cmds *loadgen.RoundTripCounter, d time.Duration) (float64, error) {
	read := func() (int64, error) {
		v := probe.InfoMap(ctx, "stats").Item("Stats", "total_commands_processed")
		return strconv.ParseInt(v, 10, 64)
	}
	a, err := read()
	if err != nil {
		return 0, fmt.Errorf("INFO stats total_commands_processed: %w", err)
	}
	sent := cmds.RoundTrips() // the first INFO is counted by the second
	start := time.Now()
	if sleepCtx(ctx, d); ctx.Err() != nil {
		return 0, ctx.Err()
	}
	own := cmds.RoundTrips() - sent + 1
	b, err := read()
	if err != nil {
		return 0, fmt.Errorf("INFO stats total_commands_processed: %w", err)
	}
	return float64(b-a-own) / time.Since(start).Seconds(), nil
}

// Ratio is the last grant over the ideal one (0 without an ideal).
func (r TenantsRow) Ratio() float64 {
	if r.Ideal <= 0 {
		return 0
	}
	return float64(r.LastGrant) / float64(r.Ideal)
}

// ReentryShare is the re-entries per grant.
func (r TenantsRow) ReentryShare() float64 { return per(int64(r.Reentries), r.Granted) }

// The goals, each met or not.
func (r TenantsRow) connsMet() bool      { return r.ConnsPeak <= r.Pool+tenantsConnsOver }
func (r TenantsRow) goroutinesMet() bool { return r.GoroutinesIdle <= tenantsGoroutines }
func (r TenantsRow) heapMet() bool       { return r.HeapPerHandle <= tenantsHeapPerHandle }
func (r TenantsRow) commandsMet() bool   { return r.CommandsPerSec <= tenantsCommandsIdle }
func (r TenantsRow) heavy() bool         { return r.Callers > tenantsLight }

func (r TenantsRow) ratioGoal() float64 {
	if r.heavy() {
		return tenantsHeavyRatio
	}
	return tenantsLightRatio
}

func (r TenantsRow) doneMet() bool {
	return r.Errors == 0 && r.Granted == r.BucketCallers && r.Ratio() <= r.ratioGoal()
}

func (r TenantsRow) reentriesMet() bool { return r.ReentryShare() <= tenantsReentries }

// NoExcess reports whether every bucket held its limit and no semaphore
// was seen holding more than its permits.
func (r TenantsRow) NoExcess() bool {
	return r.ExcessSlots <= 0 && r.ExcessStarts <= 0 && r.MostHeld <= tenantsPermits
}

func (t *Tenants) table(tb *table, _ Limit) {
	tb.title("TENANTS: %s buckets (each its own name, 5/s, burst 1) and %s semaphores (%d permit, held %v by each caller) on one go-redis client; a burst of callers to each, then idle",
		commas(t.Buckets), commas(t.Semaphores), tenantsPermits, tenantsHold)
	handles := t.Buckets + t.Semaphores
	for _, r := range t.Rows {
		tb.row(fmt.Sprintf("%d callers a handle", r.Callers), "", fmt.Sprintf("%s bucket callers and %s semaphore callers at once; pool %d",
			commas(r.BucketCallers), commas(r.SemaphoreCallers), r.Pool))
		note := fmt.Sprintf("ideal %s (a FIFO queue at each bucket's limit, same calls): %.2f×; %s", dur(r.Ideal), r.Ratio(),
			tb.goal(r.doneMet(), fmt.Sprintf("all granted, ≤ %.1f× the ideal", r.ratioGoal())))
		tb.row("  last grant", dur(r.LastGrant), note)
		errs := fmt.Sprintf("%s errors (deadline %v)", commas(r.Errors), t.Deadline)
		if r.Err != "" {
			errs += "; first: " + r.Err
		}
		tb.row("  granted", fmt.Sprintf("%s of %s", commas(r.Granted), commas(r.BucketCallers)), errs)
		reNote := "of every caller, per grant: each lost its grant time (e.g. Redis restarted) or met a change of the policies (SetPolicies), and queued again at the back"
		if r.heavy() {
			reNote = tb.goal(r.reentriesMet(), fmt.Sprintf("≤ %.0f %% of grants", 100*tenantsReentries)) + "; " + reNote
		}
		tb.row("  queued again at the back (re-entries)", fmt.Sprintf("%s (%.2f %%)", commas(r.Reentries), 100*r.ReentryShare()), reNote)
		tb.row("  late callers (retimes)", commas(r.Retimes),
			fmt.Sprintf("came > MaxLateness (%s) after their grant time; %s started at once with the missed grant's tokens, still unused in the bucket, the others took the next grant time, ahead of the queue",
				dur(defaultMaxLateness), commas(r.Refunds)))
		tb.row("  excess over the limit", fmt.Sprintf("%d", max(r.ExcessSlots, r.ExcessStarts, r.MostHeld-tenantsPermits, 0)),
			tb.goal(r.NoExcess(), "0")+fmt.Sprintf(": every grant judged; the worst bucket's busiest window, grant times: %s, start times in windows %s longer: %s; most permits of one semaphore held at once %d",
				vsLimit(r.ExcessSlots), dur(defaultMaxLateness+startSlack), vsLimit(r.ExcessStarts), r.MostHeld))
		tb.row("  semaphores: last acquire", dur(r.LastAcquire), fmt.Sprintf("%s of %s acquired, %d errors; with perfect hand-overs the last acquires after %v",
			commas(r.Acquired), commas(r.SemaphoreCallers), r.SemaphoreErrors, time.Duration(r.Callers-1)*tenantsHold))
		tb.row("  Redis connections, most", commas(r.ConnsPeak), fmt.Sprintf("%s; this client's (CLIENT LIST, by name), sampled every %v from the burst on; idle %s, after Close %s",
			tb.goal(r.connsMet(), fmt.Sprintf("≤ pool + %d (%d)", tenantsConnsOver, r.Pool+tenantsConnsOver)), tenantsSample, commas(r.ConnsIdle), commas(r.ConnsAfterClose)))
		tb.row("  goroutines, idle", commas(r.GoroutinesIdle), fmt.Sprintf("%s; beyond the process's before the client; most during the burst %s, after Close %s",
			tb.goal(r.goroutinesMet(), fmt.Sprintf("≤ %d whatever the count of handles", tenantsGoroutines)), commas(r.GoroutinesPeak), commas(r.GoroutinesAfterClose)))
		tb.row("  heap per idle handle", bytesOf(r.HeapPerHandle), fmt.Sprintf("%s; live heap after GC %s beyond the one before the handles, / %s handles",
			tb.goal(r.heapMet(), "≤ 10 KB"), bytesOf(float64(r.HeapIdle)), commas(handles)))
		tb.row("  Redis commands/s, idle", fmt.Sprintf("%.1f", r.CommandsPerSec), fmt.Sprintf("%s; INFO total_commands_processed over %v, %v after the last caller returned, our own INFO left out",
			tb.goal(r.commandsMet(), fmt.Sprintf("≤ %.0f", tenantsCommandsIdle)), t.Idle, tenantsSettle))
		tb.row("  Close of every handle", dur(r.Close), fmt.Sprintf("%s handles one after another: %s each", commas(handles), dur(r.Close/time.Duration(max(handles, 1)))))
	}
}

// bytesOf formats a size in B, KB or MB (of 1024).
func bytesOf(b float64) string {
	switch {
	case b >= 1<<20 || b <= -1<<20:
		return fmt.Sprintf("%.1f MB", b/(1<<20))
	case b >= 1<<10 || b <= -1<<10:
		return fmt.Sprintf("%.1f KB", b/(1<<10))
	}
	return fmt.Sprintf("%.0f B", b)
}

func (t *Tenants) gobench(g *gobench) {
	for _, r := range t.Rows {
		g.line(fmt.Sprintf("Tenants/callers=%d", r.Callers), t.Buckets+t.Semaphores,
			ms(r.LastGrant), "ms-last-grant",
			ms(r.Ideal), "ms-ideal",
			f(r.Ratio()), "last/ideal",
			r.Granted, "granted",
			f(100*r.ReentryShare()), "pct-reentries",
			r.Retimes, "retimes",
			r.Refunds, "refunds",
			max(r.ExcessSlots, r.ExcessStarts, 0), "excess",
			r.ConnsPeak, "conns",
			r.GoroutinesIdle, "goroutines-idle",
			f(r.HeapPerHandle), "B/handle",
			f(r.CommandsPerSec), "cmds/s-idle",
			ms(r.Close), "ms-close")
	}
}
