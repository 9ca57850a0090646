package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"maps"
	"math/rand/v2"
	"net/url"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/testing/faultproxy"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
)

// The chaos soak (bench chaos): saturated callers in several worker processes,
// some connected through a faultproxy each, while faults happen at random
// one after another; then every record is judged. docs/benchmarks.md
// describes it.

// Chaos settings that are not flags.
const (
	chaosLockTTL   = 300 * time.Millisecond // short, so that take-overs happen often
	chaosHeartbeat = 50 * time.Millisecond  // workers report their scheduler steps this often
	chaosBackoff   = 5 * time.Millisecond   // after a failed Enter, as a real client would
	chaosQuietHead = time.Second            // no fault before this
	chaosQuietTail = 3 * time.Second        // nor in the last this long: recovery is measured
	chaosBurst     = 200                    // callers of a cancellation burst
	// hangSlack is how far past its deadline an Enter may return before
	// it counts as a hang: scheduling delay on a loaded 2-core machine
	// under -race (bucket's fault tests use the same).
	hangSlack = 200 * time.Millisecond
	// chaosMaxDelay is the largest one-way delay the delay fault adds; the
	// start times are judged with it on top of MaxLateness, as
	// bucket/TestRedisSlow does.
	chaosMaxDelay = 25 * time.Millisecond
)

// Fault kinds.
const (
	faultKillScheduler = "kill scheduler"
	faultKillWorker    = "kill worker"
	faultStopWorker    = "stop worker"
	faultKillRedis     = "kill redis"
	faultPauseRedis    = "pause redis"
	faultDelay         = "delay"
	faultCut           = "cut"
	faultCancelBurst   = "cancel burst"
)

// Chaos is the outcome of a chaos soak.
type Chaos struct {
	Seed      uint64        `json:"seed"`
	Duration  time.Duration `json:"duration_ns"`
	Procs     int           `json:"procs"`   // worker slots
	Proxied   int           `json:"proxied"` // of them behind a faultproxy each
	Callers   int           `json:"callers"`
	Deadline  time.Duration `json:"deadline_ns"` // of every Enter but the bursts'
	LockTTL   time.Duration `json:"lock_ttl_ns"`
	OwnServer bool          `json:"own_server"` // false: Redis faults skipped
	Started   int           `json:"processes_started"`

	Faults []FaultRecord `json:"faults"`

	Enters  int            `json:"enters"`  // outcomes received
	Grants  int            `json:"grants"`  // successful
	Errors  map[string]int `json:"errors"`  // by kind
	Stopped int            `json:"stopped"` // cancelled by the stop at the end: not errors
	// Hangs are Enters that returned more than HangSlack past their
	// deadline (outside a freeze of their own process), plus those that
	// never returned from a live process. FrozenLate are the Enters that
	// returned late because their own process was SIGSTOPped: excused.
	Hangs      int           `json:"hangs"`
	WorstOver  time.Duration `json:"worst_overrun_ns"` // latest return past a deadline, excused ones left out
	FrozenLate int           `json:"frozen_late"`
	HangSlack  time.Duration `json:"hang_slack_ns"`
	// Lost are Enters begun by a process alive at the end that returned
	// neither a grant nor an error.
	Lost int `json:"lost"`
	// Evidence: the records behind any hang or lost caller (at most 20).
	Evidence []loadgen.Grant `json:"evidence,omitempty"`

	// The guarantee, judged per Redis epoch (a restart of redis-server
	// starts an empty, full bucket: each epoch is judged on its own, so
	// the extra burst a restart may give is allowed, and only that).
	Epochs      []Epoch       `json:"epochs"`
	ExcessSlots int           `json:"excess_slots"`        // worst over epochs
	ExcessStart int           `json:"excess_starts_slack"` // worst over epochs
	StartSlack  time.Duration `json:"start_slack_ns"`
	Early       int           `json:"early"` // grants that returned > 100 µs before their slot
	// AcrossEpochs is the slots checked as one series, with nothing
	// allowed for restarts: it may exceed 0 by up to Capacity per
	// restart (Restarts × Capacity is printed next to it).
	AcrossEpochs int `json:"excess_slots_across_epochs"`
	Restarts     int `json:"restarts"`
	// Reentries, Retimes and Refunds sum the grants' Report figures of
	// the same names.
	Reentries int `json:"reentries"`
	Retimes   int `json:"retimes"`
	Refunds   int `json:"refunds"`
	// PerSecond is grants per second over the run; Limit the bucket's.
	PerSecond float64 `json:"grants_per_s"`
	Limit     float64 `json:"limit_per_s"`
}

// Epoch is the grants of one life of redis-server.
type Epoch struct {
	From        time.Duration `json:"from_ns"` // since the run began; 0 for the first
	Grants      int           `json:"grants"`
	ExcessSlots int           `json:"excess_slots"`
	ExcessStart int           `json:"excess_starts_slack"`
}

// OK reports whether the soak met its goal: no excess, hang or lost caller.
func (c Chaos) OK() bool {
	return c.ExcessSlots <= 0 && c.ExcessStart <= 0 && c.Early == 0 && c.Hangs == 0 && c.Lost == 0
}

// FaultRecord is one fault of the log.
type FaultRecord struct {
	At     time.Duration `json:"at_ns"`     // since the run began
	Kind   string        `json:"kind"`      // one of the fault kinds
	Target string        `json:"target"`    // what it hit
	Lasted time.Duration `json:"lasted_ns"` // until the fault was undone
	// Recovery is the time from the end of the fault to the next grant,
	// of any process; TargetRecovery to the next grant of the process hit
	// (its replacement after a kill); -1: none before the end.
	Recovery       time.Duration `json:"recovery_ns"`
	TargetRecovery time.Duration `json:"target_recovery_ns"`
	Note           string        `json:"note,omitempty"`

	end    time.Time
	target []int // process ids whose grants are the target's; nil: any
}

// chaosProc is a worker process started by the soak.
type chaosProc struct {
	id      int
	p       *loadgen.Proc
	slot    int // -1: a cancellation burst
	timeout time.Duration
	killed  bool // by a fault: its unfinished Enters are not lost
}

// chaosSlot is a place for one worker, direct or behind its own proxy.
type chaosSlot struct {
	proxy *faultproxy.Proxy
	cur   *chaosProc
}

type chaosRun struct {
	tg       target
	cfg      bucket.Config
	callers  []int // per slot
	deadline time.Duration
	rng      *rand.Rand
	stderr   io.Writer
	begin    time.Time
	end      time.Time

	slots    []*chaosSlot
	procs    []*chaosProc
	freezes  map[int][][2]time.Time // process id → SIGSTOP intervals
	restarts []time.Time            // epoch boundaries
	faults   []FaultRecord
}

func (*Chaos) about() about {
	return about{name: "chaos", takes: "--duration plus ~5 s",
		what: "saturated callers while faults happen at random; judged for excess between Redis restarts, hangs and lost callers"}
}

func (c *Chaos) flags(fs *flag.FlagSet) {
	fs.DurationVar(&c.Duration, "duration", 2*time.Minute, "how long the soak runs")
	fs.Uint64Var(&c.Seed, "seed", 0, "seed of the fault schedule: the same seed replays it (0: from the clock; the seed used is printed)")
	fs.DurationVar(&c.Deadline, "deadline", 2*time.Second, "every Enter's deadline")
	fs.IntVar(&c.Callers, "callers", 400, "callers in total, spread over the worker processes")
	fs.IntVar(&c.Procs, "procs", 4, "worker processes (half of them behind a fault proxy each)")
}

func (c *Chaos) check() error {
	switch least := 2 * (chaosQuietHead + chaosQuietTail); {
	case c.Duration < least:
		return fmt.Errorf("--duration %v: want at least %v", c.Duration, least)
	case c.Deadline <= 0:
		return fmt.Errorf("--deadline %v: want > 0", c.Deadline)
	case c.Callers < 1:
		return fmt.Errorf("--callers %d: want ≥ 1", c.Callers)
	case c.Procs < 1 || c.Procs > c.Callers:
		return fmt.Errorf("--procs %d: want between 1 and --callers (%d)", c.Procs, c.Callers)
	}
	return nil
}

// run runs the soak and judges it.
func (c *Chaos) run(ctx context.Context, e *env) (err error) {
	if c.Seed == 0 {
		c.Seed = uint64(time.Now().UnixNano())
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("seed %d: %w", c.Seed, err)
		}
	}()
	tg, cfg, callers, procs, d, deadline, seed, stderr := e.target, e.limit, c.Callers, c.Procs, c.Duration, c.Deadline, c.Seed, e.log
	cfg.Name = e.name
	cfg.LockTTL = chaosLockTTL
	cfg.MaxLateness = cmp.Or(cfg.MaxLateness, defaultMaxLateness)
	proxied := procs / 2
	*c = Chaos{Seed: seed, Duration: d, Procs: procs, Proxied: proxied, Callers: callers, Deadline: deadline,
		LockTTL: cfg.LockTTL, OwnServer: tg.srv != nil, HangSlack: hangSlack, Errors: map[string]int{},
		Limit: float64(cfg.RefillAmount) / cfg.RefillFrequency.Seconds()}
	r := &chaosRun{tg: tg, cfg: cfg, deadline: deadline, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)),
		stderr: stderr, freezes: map[int][][2]time.Time{}}
	if !c.OwnServer {
		fmt.Fprintln(stderr, "chaos: --redis given: redis-server is not ours, so it is neither killed nor paused")
	}
	fmt.Fprintf(stderr, "chaos: seed %d, %v, %d callers in %d processes (%d behind a proxy), deadline %v, LockTTL %v\n",
		seed, d, callers, procs, proxied, deadline, cfg.LockTTL)
	defer r.closeAll()
	for i := range procs {
		s := &chaosSlot{}
		if i < proxied {
			px, err := faultproxy.New(tg.opt.Addr)
			if err != nil {
				return err
			}
			s.proxy = px
		}
		r.slots = append(r.slots, s)
		r.callers = append(r.callers, share(callers, procs, i))
	}
	startAt := time.Now().Add(workerStartup)
	r.begin, r.end = startAt, startAt.Add(d)
	for i := range r.slots {
		if _, err := r.startWorker(i, startAt); err != nil {
			return err
		}
	}
	for _, p := range r.procs {
		select {
		case <-p.p.Ready():
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if err := r.inject(ctx); err != nil {
		return err
	}
	if err := sleepUntil(ctx, r.end); err != nil {
		return err
	}
	stopAt := time.Now()
	lost := r.stop()
	r.judge(c, stopAt, lost)
	return nil
}

// startWorker starts a worker in slot i (replacing whatever ran there),
// its callers entering from startAt until the end of the run.
func (r *chaosRun) startWorker(i int, startAt time.Time) (*chaosProc, error) {
	s := r.slots[i]
	spec := r.spec(r.callers[i], r.deadline)
	spec.Until = r.end.Sub(startAt)
	spec.StartAt = startAt.UnixNano()
	spec.Heartbeat = chaosHeartbeat
	if s.proxy != nil {
		spec.Addr = s.proxy.Addr()
		if spec.URL != "" {
			u, err := url.Parse(spec.URL)
			if err != nil {
				return nil, err
			}
			u.Host = s.proxy.Addr()
			spec.URL = u.String()
		}
	}
	cp, err := r.start(spec, i)
	if err != nil {
		return nil, err
	}
	s.cur = cp
	return cp, nil
}

func (r *chaosRun) spec(callers int, timeout time.Duration) loadgen.Spec {
	return loadgen.Spec{Proc: len(r.procs), Addr: r.tg.opt.Addr, URL: r.tg.url, Bucket: r.cfg, Callers: callers,
		Timeout: timeout, Announce: true, Backoff: chaosBackoff, QuietRedis: true}
}

func (r *chaosRun) start(spec loadgen.Spec, slot int) (*chaosProc, error) {
	p, err := loadgen.Start(spec)
	if err != nil {
		return nil, fmt.Errorf("start worker: %w", err)
	}
	cp := &chaosProc{id: spec.Proc, p: p, slot: slot, timeout: spec.Timeout}
	r.procs = append(r.procs, cp)
	return cp, nil
}

// inject runs faults one after another, at random, until the quiet tail.
func (r *chaosRun) inject(ctx context.Context) error {
	kinds := []string{faultKillScheduler, faultKillWorker, faultStopWorker, faultDelay, faultCut, faultCancelBurst}
	if r.tg.srv != nil {
		kinds = append(kinds, faultKillRedis, faultPauseRedis)
	}
	if len(r.slots) < 2 { // a cut or delay needs a proxied worker
		kinds = slices.DeleteFunc(kinds, func(k string) bool { return k == faultDelay || k == faultCut })
	}
	var deck []string
	next := r.begin.Add(chaosQuietHead)
	for {
		if err := sleepUntil(ctx, next); err != nil {
			return err
		}
		if time.Until(r.end) < chaosQuietTail {
			return nil
		}
		if len(deck) == 0 { // every kind once per round, in a random order
			deck = slices.Clone(kinds)
			r.rng.Shuffle(len(deck), func(i, j int) { deck[i], deck[j] = deck[j], deck[i] })
		}
		kind := deck[0]
		deck = deck[1:]
		f, err := r.fault(ctx, kind)
		if err != nil {
			return fmt.Errorf("%s: %w", kind, err)
		}
		f.Lasted = f.end.Sub(r.begin) - f.At
		fmt.Fprintf(r.stderr, "chaos: %6.2fs %-14s %s (%v) %s\n", f.At.Seconds(), f.Kind, f.Target, f.Lasted.Round(time.Millisecond), f.Note)
		r.faults = append(r.faults, f)
		next = time.Now().Add(r.between(300*time.Millisecond, 2*time.Second))
	}
}

// between draws a duration uniformly in [lo, hi].
func (r *chaosRun) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(r.rng.Int64N(int64(hi-lo)+1))
}

// schedulerSlot is the slot whose worker ran a scheduler step most
// recently, or a random one if none has.
func (r *chaosRun) schedulerSlot() (int, bool) {
	best, at := -1, time.Time{}
	for i, s := range r.slots {
		if t := s.cur.p.LastStep(); t.After(at) {
			best, at = i, t
		}
	}
	if best < 0 {
		return r.rng.IntN(len(r.slots)), false
	}
	return best, true
}

func (r *chaosRun) describe(i int) string {
	s := r.slots[i]
	how := "direct"
	if s.proxy != nil {
		how = "proxied"
	}
	return fmt.Sprintf("worker %d (pid %d, %s)", s.cur.id, s.cur.p.Pid(), how)
}

// proxied lists the slots behind a proxy.
func (r *chaosRun) proxied() []int {
	var is []int
	for i, s := range r.slots {
		if s.proxy != nil {
			is = append(is, i)
		}
	}
	return is
}

// fault injects one fault of kind and undoes it; it returns its record.
func (r *chaosRun) fault(ctx context.Context, kind string) (FaultRecord, error) {
	f := FaultRecord{At: time.Since(r.begin), Kind: kind}
	switch kind {
	case faultKillScheduler, faultKillWorker:
		i, sched := r.rng.IntN(len(r.slots)), false
		if kind == faultKillScheduler {
			i, sched = r.schedulerSlot()
			if !sched {
				f.Note = "no step seen yet: a random worker"
			}
		}
		old := r.slots[i].cur
		f.Target = r.describe(i)
		old.killed = true
		if err := old.p.Signal(syscall.SIGKILL); err != nil {
			return f, err
		}
		<-old.p.Done()
		cp, err := r.startWorker(i, time.Now())
		if err != nil {
			return f, err
		}
		select {
		case <-cp.p.Ready():
		case <-ctx.Done():
			return f, ctx.Err()
		}
		f.end = time.Now()
		f.Note += fmt.Sprintf(" replaced by worker %d (pid %d)", cp.id, cp.p.Pid())
		f.target = []int{cp.id}
	case faultStopWorker:
		i := r.rng.IntN(len(r.slots))
		if r.rng.IntN(2) == 0 {
			if j, ok := r.schedulerSlot(); ok {
				i, f.Note = j, "the scheduler's process"
			}
		}
		cp := r.slots[i].cur
		f.Target = r.describe(i)
		from := time.Now()
		if err := cp.p.Signal(syscall.SIGSTOP); err != nil {
			return f, err
		}
		_ = sleepUntil(ctx, from.Add(r.cfg.LockTTL+r.between(100*time.Millisecond, 700*time.Millisecond)))
		if err := cp.p.Signal(syscall.SIGCONT); err != nil {
			return f, err
		}
		f.end = time.Now()
		r.freezes[cp.id] = append(r.freezes[cp.id], [2]time.Time{from, f.end})
		f.target = []int{cp.id}
	case faultKillRedis:
		f.Target = "redis-server " + r.tg.srv.Addr()
		if err := r.tg.srv.Kill(); err != nil {
			return f, err
		}
		_ = sleepUntil(ctx, time.Now().Add(r.between(200*time.Millisecond, 1500*time.Millisecond)))
		// Every slot the old server gave is at most a Lookahead after the
		// kill; every slot of the new one is after this instant.
		r.restarts = append(r.restarts, time.Now())
		if err := r.tg.srv.Restart(); err != nil {
			return f, err
		}
		f.end = time.Now()
		f.Note = "restarted empty on the same port"
	case faultPauseRedis:
		f.Target = "redis-server " + r.tg.srv.Addr()
		if err := r.tg.srv.Pause(); err != nil {
			return f, err
		}
		_ = sleepUntil(ctx, time.Now().Add(r.between(100*time.Millisecond, time.Second)))
		if err := r.tg.srv.Resume(); err != nil {
			return f, err
		}
		f.end = time.Now()
	case faultDelay:
		f.Target = "every proxied worker"
		for _, i := range r.proxied() {
			r.slots[i].proxy.SetDelay(chaosMaxDelay/10, chaosMaxDelay)
		}
		_ = sleepUntil(ctx, time.Now().Add(r.between(time.Second, 3*time.Second)))
		for _, i := range r.proxied() {
			r.slots[i].proxy.SetDelay(0, 0)
			f.target = append(f.target, r.slots[i].cur.id)
		}
		f.end = time.Now()
		f.Note = fmt.Sprintf("round trips +%v–%v", 2*chaosMaxDelay/10, 2*chaosMaxDelay)
	case faultCut:
		proxied := r.proxied()
		i := proxied[r.rng.IntN(len(proxied))]
		f.Target = r.describe(i)
		r.slots[i].proxy.Cut()
		_ = sleepUntil(ctx, time.Now().Add(r.between(300*time.Millisecond, 2*time.Second)))
		r.slots[i].proxy.Restore()
		f.end = time.Now()
		f.target = []int{r.slots[i].cur.id}
	case faultCancelBurst:
		timeout := r.between(20*time.Millisecond, 150*time.Millisecond).Round(time.Millisecond)
		spec := r.spec(chaosBurst, timeout)
		spec.Enters = 1
		cp, err := r.start(spec, -1)
		if err != nil {
			return f, err
		}
		f.Target = fmt.Sprintf("worker %d (pid %d): %d callers, deadline %v", cp.id, cp.p.Pid(), chaosBurst, timeout)
		select {
		case <-cp.p.Done():
		case <-time.After(timeout + 10*time.Second):
			f.Note = "still running after its deadline + 10 s"
		case <-ctx.Done():
			return f, ctx.Err()
		}
		f.end = time.Now()
	default:
		return f, fmt.Errorf("unknown fault %q", kind)
	}
	return f, nil
}

// stop asks every live worker to stop (in-flight Enters are cancelled),
// waits for them, and kills those that do not exit: the announcements
// they leave are lost callers. Killed workers' announcements are not.
func (r *chaosRun) stop() []loadgen.Grant {
	for _, cp := range r.procs {
		cp.p.Stop()
	}
	var lost []loadgen.Grant
	deadline := time.Now().Add(r.deadline + hangSlack + 2*time.Second)
	for _, cp := range r.procs {
		select {
		case <-cp.p.Done():
		case <-time.After(time.Until(deadline)):
			if !cp.killed {
				lost = append(lost, cp.p.Pending()...)
			}
			cp.killed = true
			_ = cp.p.Signal(syscall.SIGKILL)
			<-cp.p.Done()
			continue
		}
		if !cp.killed {
			// Exited by itself: every Enter it began has an outcome,
			// unless it crashed.
			lost = append(lost, cp.p.Pending()...)
		}
	}
	return lost
}

func (r *chaosRun) closeAll() {
	for _, cp := range r.procs {
		select {
		case <-cp.p.Done():
		default:
			_ = cp.p.Signal(syscall.SIGCONT)
			_ = cp.p.Signal(syscall.SIGKILL)
			<-cp.p.Done()
		}
	}
	for _, s := range r.slots {
		if s.proxy != nil {
			s.proxy.Close()
		}
	}
}

// frozenDuring reports whether process id was SIGSTOPped at some time
// within [from, to].
func (r *chaosRun) frozenDuring(id int, from, to time.Time) bool {
	for _, iv := range r.freezes[id] {
		if iv[0].Before(to) && iv[1].After(from) {
			return true
		}
	}
	return false
}

// errorKind sorts an Enter's error text into a few kinds.
func errorKind(e string) string {
	for _, k := range []struct{ sub, kind string }{
		{"context deadline exceeded", "deadline"},
		{"context canceled", "canceled"},
		{"connection refused", "connection refused"},
		{"i/o timeout", "i/o timeout"},
		{"EOF", "connection lost"},
		{"connection reset", "connection lost"},
		{"broken pipe", "connection lost"},
		{"use of closed network connection", "connection lost"},
		{"LOADING", "redis loading"},
		{"NOSCRIPT", "noscript"},
	} {
		if strings.Contains(e, k.sub) {
			return k.kind
		}
	}
	if len(e) > 60 {
		e = e[:60] + "…"
	}
	return "other: " + e
}

// judge fills c from every record of every process.
func (r *chaosRun) judge(c *Chaos, stopAt time.Time, lost []loadgen.Grant) {
	c.Started = len(r.procs)
	c.Restarts = len(r.restarts)
	c.StartSlack = r.cfg.MaxLateness + startSlack + chaosMaxDelay
	c.Faults = r.faults
	type rec struct {
		loadgen.Grant
		timeout time.Duration
	}
	var all []rec
	for _, cp := range r.procs {
		for _, g := range cp.p.Grants() {
			all = append(all, rec{g, cp.timeout})
		}
	}
	slices.SortFunc(all, func(a, b rec) int { return cmp.Compare(a.End, b.End) })
	evidence := func(g loadgen.Grant) {
		if len(c.Evidence) < 20 {
			c.Evidence = append(c.Evidence, g)
		}
	}
	l := guarantee.Limit{Capacity: r.cfg.Capacity, RefillAmount: r.cfg.RefillAmount, RefillFrequency: r.cfg.RefillFrequency}
	epochs := make([]struct{ slots, starts []time.Time }, len(r.restarts)+1)
	epochOf := func(slot time.Time) int {
		e := 0
		for e < len(r.restarts) && !slot.Before(r.restarts[e]) {
			e++
		}
		return e
	}
	var allSlots []time.Time
	for _, g := range all {
		c.Enters++
		frozen := r.frozenDuring(g.Proc, time.Unix(0, g.Start), g.Time())
		if over := g.Wait() - g.timeout; over > hangSlack {
			if frozen {
				c.FrozenLate++
			} else {
				c.Hangs++
				evidence(g.Grant)
			}
		}
		if !frozen {
			c.WorstOver = max(c.WorstOver, g.Wait()-g.timeout)
		}
		if !g.OK() {
			if kind := errorKind(g.Err); kind == "canceled" && !g.Time().Before(stopAt) {
				c.Stopped++
			} else {
				c.Errors[kind]++
			}
			continue
		}
		c.Grants++
		c.Reentries += g.Reentries
		c.Retimes += g.Retimes
		c.Refunds += g.Refunds
		e := epochOf(g.SlotTime())
		epochs[e].slots = append(epochs[e].slots, g.SlotTime())
		allSlots = append(allSlots, g.SlotTime())
		if g.Time().Before(g.SlotTime().Add(-100 * time.Microsecond)) {
			c.Early++
			evidence(g.Grant)
		}
		// A process frozen between its slot and its return starts late
		// through no fault of the bucket's (docs/guarantees.md).
		if !r.frozenDuring(g.Proc, g.SlotTime(), g.Time()) {
			epochs[e].starts = append(epochs[e].starts, g.Time())
		}
	}
	c.Lost = len(lost)
	c.Hangs += len(lost) // never returned from a live process
	for _, g := range lost {
		evidence(g)
	}
	c.ExcessSlots, c.ExcessStart = -1<<31, -1<<31
	for i, e := range epochs {
		ep := Epoch{Grants: len(e.slots), ExcessSlots: guarantee.Check(e.slots, l).Excess,
			ExcessStart: guarantee.CheckSlack(e.starts, l, c.StartSlack).Excess}
		if i > 0 {
			ep.From = r.restarts[i-1].Sub(r.begin)
		}
		c.Epochs = append(c.Epochs, ep)
		c.ExcessSlots = max(c.ExcessSlots, ep.ExcessSlots)
		c.ExcessStart = max(c.ExcessStart, ep.ExcessStart)
	}
	c.AcrossEpochs = guarantee.Check(allSlots, l).Excess
	c.PerSecond = float64(c.Grants) / stopAt.Sub(r.begin).Seconds()

	// Recovery: from the end of each fault to the next grant.
	for i := range c.Faults {
		f := &c.Faults[i]
		f.Recovery, f.TargetRecovery = -1, -1
		for _, g := range all {
			if !g.OK() || !g.Time().After(f.end) {
				continue
			}
			if f.Recovery < 0 {
				f.Recovery = g.Time().Sub(f.end)
			}
			if f.TargetRecovery < 0 && (f.target == nil || slices.Contains(f.target, g.Proc)) {
				f.TargetRecovery = g.Time().Sub(f.end)
			}
			if f.Recovery >= 0 && f.TargetRecovery >= 0 {
				break
			}
		}
	}
}

func (c *Chaos) table(t *table, l Limit) {
	t.title("CHAOS: seed %d, %v, %d callers in %d worker processes (each replaced when killed; %d behind a fault proxy), capacity %d, %d every %v = %s/s, deadline %v, LockTTL %v",
		c.Seed, c.Duration, c.Callers, c.Procs, c.Proxied, l.Capacity, l.RefillAmount, l.RefillFrequency, num(l.PerSecond), c.Deadline, c.LockTTL)
	if !c.OwnServer {
		fmt.Fprintln(t, "  (not a redis-server of its own: --redis, or the miniredis fallback; so no Redis kill, restart or pause)")
	}
	fmt.Fprintf(t, "  verdict: %s\n", t.goal(c.OK(), "never over the limit, no start before its grant time, no hang, no lost caller"))
	t.miss("verdict")
	t.row("Enters", commas(c.Enters), fmt.Sprintf("%s processes started in all (replacements and cancellation bursts included)", commas(c.Started)))
	t.row("grants", commas(c.Grants), fmt.Sprintf("%s/s over the run (limit %s/s); %s times a caller queued again at the back (re-entries), %s times a caller came late for its grant time (retimes; %s of them started at once with its unused tokens, the others took the next)", num(c.PerSecond), num(c.Limit), commas(c.Reentries), commas(c.Retimes), commas(c.Refunds)))
	kinds := slices.Collect(maps.Keys(c.Errors))
	slices.SortFunc(kinds, func(a, b string) int { return cmp.Or(c.Errors[b]-c.Errors[a], strings.Compare(a, b)) })
	var parts []string
	total := 0
	for _, k := range kinds {
		parts = append(parts, fmt.Sprintf("%s %s", k, commas(c.Errors[k])))
		total += c.Errors[k]
	}
	t.row("errors", commas(total), strings.Join(parts, ", "))
	t.row("  cancelled by the stop at the end", commas(c.Stopped), "not counted as errors")
	t.row("busiest window, grant times", vsLimit(c.ExcessSlots), fmt.Sprintf("judged between Redis restarts (%d restarts): a restarted Redis starts with a full bucket", c.Restarts))
	t.row("busiest window, start times", vsLimit(c.ExcessStart), fmt.Sprintf("between restarts, windows %s longer (MaxLateness + %s for the reply's trip + the delay fault's one-way %s)", dur(c.StartSlack), dur(startSlack), dur(chaosMaxDelay)))
	t.row("  grant times, across restarts", vsLimit(c.AcrossEpochs), fmt.Sprintf("nothing allowed for restarts: may be up to capacity × restarts = %d over", l.Capacity*c.Restarts))
	t.row("returned > 100 µs before grant time", commas(c.Early), "")
	t.row("hangs", commas(c.Hangs), fmt.Sprintf("returned > %v past the deadline, or never (worst overrun %s); %d returned late because their own process was stopped (excused)", c.HangSlack, dur(c.WorstOver), c.FrozenLate))
	t.row("lost callers", commas(c.Lost), "begun in a live process, no grant and no error")
	t.Flush()
	fmt.Fprintln(t, "\n  fault log (recovery: end of the fault → next grant, of any process / of the process hit)")
	t.row("at", "fault", "lasted", "recovery", "of target", "target")
	rec := func(d time.Duration) string {
		if d < 0 {
			return "none"
		}
		return dur(d)
	}
	for _, f := range c.Faults {
		target := f.Target
		if f.Note != "" {
			target += "; " + strings.TrimSpace(f.Note)
		}
		t.row(fmt.Sprintf("%.2fs", f.At.Seconds()), f.Kind, dur(f.Lasted), rec(f.Recovery), rec(f.TargetRecovery), target)
	}
	t.Flush()
	if len(c.Evidence) > 0 {
		fmt.Fprintln(t, "\n  evidence (records of hangs, lost callers, early starts):")
		for _, g := range c.Evidence {
			granted := "none"
			if g.Slot != 0 {
				granted = g.SlotTime().UTC().Format("15:04:05.000000")
			}
			fmt.Fprintf(t, "    proc %d caller %d enter %d: begun %s, wait %s, grant time %s, err %q, only announced %v\n",
				g.Proc, g.Caller, g.Seq, time.Unix(0, g.Start).UTC().Format("15:04:05.000000"), dur(g.Wait()), granted, g.Err, g.Begun)
		}
	}
}

func (c *Chaos) gobench(g *gobench) {
	total := 0
	for _, n := range c.Errors {
		total += n
	}
	g.line("Chaos", c.Enters, c.Grants, "grants", c.ExcessSlots, "excess-slots", c.ExcessStart, "excess-starts-slack",
		c.Hangs, "hangs", c.Lost, "lost", total, "errors", len(c.Faults), "faults", c.Restarts, "restarts")
}
