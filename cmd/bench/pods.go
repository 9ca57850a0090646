package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/bench/workers"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
)

// Pods is the saturated run in worker processes that each live in a
// cgroup with a CPU quota, as the pods of a Kubernetes deployment with
// limits.cpu 250m do: each caller spends some CPU on every grant and a
// busy goroutine takes the rest, so every pod uses up its quota early in
// each period and the kernel stops (throttles) all its threads until the
// next. A caller whose grant time falls while its pod is throttled comes
// late. The bucket should still use its limit nearly as fully as
// redis_rate in the same pods, and never exceed it.
type Pods struct {
	Pods     int           `json:"pods"`
	Callers  int           `json:"callers"` // in total, spread over the pods
	Duration time.Duration `json:"duration_ns"`
	Rate     int           `json:"rate_per_s"`
	Burst    int           `json:"burst"`
	// MilliCPU is each pod's CPU limit, in thousandths of a CPU: a quota
	// of MilliCPU × 100 µs every 100 ms.
	MilliCPU int `json:"milli_cpu"`
	// Work is the CPU a caller spends on each grant (a busy loop, timed
	// outside the pods); Hog the busy goroutines each pod runs beside
	// its callers.
	Work time.Duration `json:"work_ns"`
	Hog  int           `json:"hog_per_pod"`

	// Skipped says why the scenario did not run (no cgroup could be
	// made, or no sh to start a worker in one); "" when it ran.
	Skipped string `json:"skipped,omitempty"`
	// Cgroup says which cgroup version and where; Cgroups are the pods'
	// directories, removed after the run.
	Cgroup  string   `json:"cgroup,omitempty"`
	Cgroups []string `json:"cgroups,omitempty"`
	// GOMAXPROCS is what the Go runtime chose inside the pods (least and
	// most over the worker processes).
	GOMAXPROCS [2]int `json:"gomaxprocs"`
	// Results has sluice's run, then redis_rate's, one after the other in
	// the same pods.
	Results []PodsRun `json:"results"`
	// ReadyLate is how long after a run's start the last worker was
	// ready (0: all in time).
	ReadyLate time.Duration `json:"ready_late_ns"`
}

// PodsRun is one limiter's run in the pods.
type PodsRun struct {
	LimiterRun
	// The pods' cpu.stat over the run, summed over the pods: periods,
	// periods in which a pod was throttled, and time throttled.
	Periods   int64         `json:"periods"`
	Throttled int64         `json:"throttled_periods"`
	Time      time.Duration `json:"throttled_ns"`
}

// The goals of the pods scenario, for sluice.
const (
	podsUtilGoal  = 0.9
	podsRatioGoal = 0.95 // of redis_rate's utilization
)

// The pods' CFS period: Kubernetes's.
const podsPeriod = 100 * time.Millisecond

func (*Pods) about() about {
	return about{name: "pods", takes: "~10 s", all: true,
		what: "the saturated run in worker processes each in a cgroup with a CPU quota (a pod with limits.cpu 250m), CPU spent on every grant; sluice then redis_rate: utilization, throttling, the limit (skipped without cgroups)"}
}

func (p *Pods) flags(fs *flag.FlagSet) {
	fs.IntVar(&p.Pods, "pods-procs", 4, "pods: worker processes, each in a cgroup of its own")
	fs.IntVar(&p.Callers, "pods-callers", 200, "callers in total, spread over the pods")
	fs.DurationVar(&p.Duration, "pods-duration", 3*time.Second, "how long each limiter's run lasts")
	fs.IntVar(&p.Rate, "pods-rate", 200, "the limit: calls a second")
	fs.IntVar(&p.Burst, "pods-burst", 20, "the limit's burst (the bucket's capacity)")
	fs.IntVar(&p.MilliCPU, "pods-cpu", 250, "each pod's CPU limit in millicores (250: a quota of 25 ms every 100 ms)")
	fs.DurationVar(&p.Work, "pods-work", 2*time.Millisecond, "CPU each caller spends on each grant (a busy loop)")
	fs.IntVar(&p.Hog, "pods-hog", 1, "busy goroutines in each pod beside its callers")
}

func (p *Pods) check() error {
	if err := checkLoad("pods-", p.Callers, p.Pods, p.Duration); err != nil {
		return err
	}
	switch {
	case p.MilliCPU < 1:
		return fmt.Errorf("--pods-cpu %d: want ≥ 1", p.MilliCPU)
	case p.Work < 0:
		return fmt.Errorf("--pods-work %v: want ≥ 0", p.Work)
	case p.Hog < 0:
		return fmt.Errorf("--pods-hog %d: want ≥ 0", p.Hog)
	}
	return checkRate("pods-", p.Rate, p.Burst)
}

func (p *Pods) run(ctx context.Context, e *env) error {
	p.Results, p.Skipped, p.Cgroups, p.ReadyLate = nil, "", nil, 0
	skip := func(why string) error {
		p.Skipped = why
		e.logf("pods: skipped: %s", p.Skipped)
		return nil
	}
	if _, err := exec.LookPath("sh"); err != nil {
		return skip("no sh on PATH, which starts each worker inside its pod")
	}
	parent, v2, err := cpuHierarchy()
	if err != nil {
		return skip("no cgroup could be made: " + err.Error())
	}
	quota := time.Duration(p.MilliCPU) * podsPeriod / 1000
	pods, err := makePods(parent, v2, e.name, p.Pods, quota)
	if err != nil {
		return skip("no cgroup could be made: " + err.Error())
	}
	defer removePods(pods)
	version := "v1"
	if v2 {
		version = "v2"
	}
	p.Cgroup = fmt.Sprintf("cgroup %s under %s", version, parent)
	for _, c := range pods {
		p.Cgroups = append(p.Cgroups, c.dir)
	}
	rounds := spinRounds(p.Work)
	if p.Work == 0 {
		rounds = 0
	}
	e.logf("pods: %d pods (%s: %v of CPU every %v), %d callers in all at %d/s, burst %d, %v of CPU a grant, %d busy goroutines a pod; sluice, then redis_rate, %v each...",
		p.Pods, p.Cgroup, quota, podsPeriod, p.Callers, p.Rate, p.Burst, p.Work, p.Hog, p.Duration)
	p.GOMAXPROCS = [2]int{1 << 30, 0}
	for i, lim := range []string{limSluice, limRedisRate} {
		begin := time.Now().Add(workerStart)
		until := begin.Add(p.Duration)
		specs := make([]callersSpec, p.Pods)
		for k := range specs {
			specs[k] = callersSpec{Proc: k, workerTarget: e.workers(), Name: fmt.Sprintf("%s-%d", e.name, i), Limiters: []string{lim},
				Rate: p.Rate, Burst: p.Burst, Callers: share(p.Callers, p.Pods, k), Spin: rounds, Hog: p.Hog,
				Begin: begin.UnixNano(), Until: until.UnixNano()}
		}
		// The pods' cpu.stat at the run's start and end, read while the
		// workers run.
		var (
			before, after []cpuStat
			statErr       error
			sampler       sync.WaitGroup
		)
		runCtx, cancel := context.WithCancel(ctx)
		sampler.Go(func() {
			if sleepUntil(runCtx, begin) != nil {
				return
			}
			if before, statErr = readStats(pods); statErr != nil {
				return
			}
			if sleepUntil(runCtx, until) != nil {
				return
			}
			after, statErr = readStats(pods)
		})
		results, err := inPods(runCtx, pods, specs)
		if err != nil || time.Now().Before(until) {
			cancel() // the sampler's reads would come too late
		}
		// Workers that end with the run (at until) may return before the
		// sampler, on a busy host, woke to read the end's stats: it reads
		// them now (the workers are gone; their cgroups' counts stand).
		// Cancelling it then failed the run (TestPodsScenario, once in
		// scripts/test beside a busy loop).
		sampler.Wait()
		cancel()
		switch {
		case err != nil:
			return err
		case statErr != nil:
			return statErr
		case after == nil:
			return errors.New("the workers ended before the run did")
		}
		for _, r := range results {
			p.GOMAXPROCS = [2]int{min(p.GOMAXPROCS[0], r.GOMAXPROCS), max(p.GOMAXPROCS[1], r.GOMAXPROCS)}
		}
		runs, late := judgeCallers(results, []string{lim}, p.Rate, p.Burst, begin, p.Duration)
		run := PodsRun{LimiterRun: runs[0]}
		for k := range pods {
			run.Periods += after[k].Periods - before[k].Periods
			run.Throttled += after[k].Throttled - before[k].Throttled
			run.Time += after[k].Time - before[k].Time
		}
		p.Results = append(p.Results, run)
		p.ReadyLate = max(p.ReadyLate, late)
	}
	return nil
}

// NoExcess reports whether sluice held the limit (true when skipped).
func (p *Pods) NoExcess() bool { return len(p.Results) == 0 || p.Results[0].NoExcess() }

func (p *Pods) table(t *table, _ Limit) {
	t.title("PODS: %d worker processes, each in a cgroup with a CPU quota of %v every %v (a pod with limits.cpu %dm); %d callers in all spend %v of CPU on each grant, beside %d busy goroutine(s) a pod; sluice for %v, then redis_rate for %v, in the same pods, at %d/s, burst %d",
		p.Pods, time.Duration(p.MilliCPU)*podsPeriod/1000, podsPeriod, p.MilliCPU, p.Callers, p.Work, p.Hog, p.Duration, p.Duration, p.Rate, p.Burst)
	if p.Skipped != "" {
		t.row("skipped", "", p.Skipped)
		return
	}
	res := p.Results
	if len(res) == 0 {
		return
	}
	sl, rr := res[0], PodsRun{}
	if len(res) > 1 {
		rr = res[1]
	}
	header := []string{""}
	for _, r := range res {
		header = append(header, r.Name)
	}
	t.row(append(header, "")...)
	row := func(name string, v func(PodsRun) string, note string) {
		cells := []string{name}
		for _, r := range res {
			cells = append(cells, v(r))
		}
		t.row(append(cells, note)...)
	}
	l := guarantee.Limit{Capacity: sl.Capacity, RefillAmount: sl.RefillAmount, RefillFrequency: sl.RefillFrequency}
	row("utilization", func(r PodsRun) string { return fmt.Sprintf("%.3f", r.Utilization) },
		fmt.Sprintf("sluice: %s, %s; grants that started within the run / what the limit allows over it (%s in %v)",
			t.goal(sl.Utilization >= podsUtilGoal, fmt.Sprintf("≥ %.1f", podsUtilGoal)),
			t.goal(sl.Utilization >= podsRatioGoal*rr.Utilization, fmt.Sprintf("≥ %.2f × redis_rate's (%.3f)", podsRatioGoal, podsRatioGoal*rr.Utilization)),
			commas(l.Allowed(p.Duration)), p.Duration))
	if p.Duration >= 2*settleTime { // LimiterRun.Settled is 0 for shorter runs
		row("  after the first second", func(r PodsRun) string { return fmt.Sprintf("%.3f", r.Settled) },
			fmt.Sprintf("no goal: grants that started from %v into the run to its end / the limit's refills over that span (its burst left out); the run's start (every caller at once on a full bucket) weighs less", settleTime))
	}
	row("granted", func(r PodsRun) string { return commas(r.Granted) }, fmt.Sprintf("errors: sluice %d, redis_rate %d%s", sl.Errors, rr.Errors, firstErr([]LimiterRun{sl.LimiterRun, rr.LimiterRun})))
	row("  still waiting at the run's end", func(r PodsRun) string { return commas(r.CutOff) }, "calls cut off when the run ended: not counted")
	row("excess over the limit, by grant time", func(r PodsRun) string { return fmt.Sprint(max(r.Excess, 0)) },
		"sluice: "+t.goal(sl.Excess <= 0, "0")+"; the busiest window against the limit (checker), sluice's grant times on Redis's clock, redis_rate's start times (it has no other)")
	row(fmt.Sprintf("  by start time, windows %s longer", dur(bucketSlack())), func(r PodsRun) string { return fmt.Sprint(max(r.ExcessSlack, 0)) },
		"sluice: "+t.goal(sl.ExcessSlack <= 0, "0")+"; windows MaxLateness + the reply's trip longer: the bucket's promise for start times")
	row("wait p50 / p99", func(r PodsRun) string { return dur(r.Wait.P50) + " / " + dur(r.Wait.P99) }, "from a call's arrival to its start")
	row("late callers (retimes)", func(r PodsRun) string {
		if r.Name != limSluice {
			return "—"
		}
		return commas(r.Retimes)
	}, fmt.Sprintf("sluice callers that came > MaxLateness (%s) after their grant time (their pod throttled); %s of them started at once with the missed grant's token, still unused in the bucket, the others took the next grant time; %s grants were claimed by a running caller from one whose pod was stopped", dur(defaultMaxLateness), commas(sl.Refunds), commas(sl.Claims)))
	row("throttled: periods", func(r PodsRun) string { return pct(int(r.Throttled), int(r.Periods)) },
		fmt.Sprintf("of the pods' CFS periods in the run, those in which the pod used up its quota and was stopped (cpu.stat: %d of %d, %d of %d)", sl.Throttled, sl.Periods, rr.Throttled, rr.Periods))
	row("throttled: time a pod", func(r PodsRun) string { return dur(r.Time / time.Duration(max(p.Pods, 1))) },
		fmt.Sprintf("cpu.stat throttled time over the %v run, a pod on average", p.Duration))
	row("Redis calls per grant", func(r PodsRun) string { return fmt.Sprintf("%.2f", r.RoundTripsPerGrant()) }, "every command and pipeline of the limiter's clients, in every pod")
	t.row("Go in the pods", fmt.Sprintf("GOMAXPROCS %d–%d", p.GOMAXPROCS[0], p.GOMAXPROCS[1]), "", p.Cgroup+"; each worker entered its cgroup before Go started, as in a container (Go sizes GOMAXPROCS to the CPU limit, never below 2)")
	if p.ReadyLate > 0 {
		t.row("late start", dur(p.ReadyLate), "", fmt.Sprintf("the last pod was ready to call %s after its run's start", dur(p.ReadyLate)))
	}
}

func (p *Pods) gobench(g *gobench) {
	for _, r := range p.Results {
		g.line("Pods/"+r.Name, r.Granted,
			f(r.Utilization), "utilization",
			r.Excess, "excess",
			r.ExcessSlack, "excess-slack",
			r.Retimes, "retimes",
			f(100*per(r.Throttled, int(r.Periods))), "pct-throttled",
			ms(r.Time/time.Duration(max(p.Pods, 1))), "ms-throttled/pod",
			ms(r.Wait.P50), "ms-wait-p50",
			r.Errors, "errors")
	}
}

// podCgroup is one pod: a cgroup of the cpu controller, with its quota.
type podCgroup struct {
	dir string
	v2  bool
}

// cpuHierarchy finds where to make cgroups with a CPU quota: under this
// process's own cgroup, in cgroup v2's hierarchy when its cpu controller
// is there, else in v1's cpu hierarchy. Its error says why not, in words.
func cpuHierarchy() (parent string, v2 bool, err error) {
	mounts, err := os.ReadFile("/proc/self/mounts")
	if err != nil {
		return "", false, fmt.Errorf("no /proc/self/mounts: %w", err)
	}
	own, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return "", false, fmt.Errorf("no /proc/self/cgroup: %w", err)
	}
	var v1 string
	for _, line := range strings.Split(string(mounts), "\n") {
		f := strings.Fields(line)
		if len(f) < 4 {
			continue
		}
		switch {
		case f[2] == "cgroup2":
			ctl, _ := os.ReadFile(filepath.Join(f[1], "cgroup.controllers"))
			if slices.Contains(strings.Fields(string(ctl)), "cpu") {
				return within(f[1], cgroupPath(string(own), "")), true, nil
			}
		case f[2] == "cgroup" && slices.Contains(strings.Split(f[3], ","), "cpu"):
			v1 = f[1]
		}
	}
	if v1 == "" {
		return "", false, errors.New("no cgroup hierarchy with the cpu controller is mounted")
	}
	return within(v1, cgroupPath(string(own), "cpu")), false, nil
}

// cgroupPath is this process's cgroup in /proc/self/cgroup's text: that
// of the v1 hierarchy with controller, or of v2 for "".
func cgroupPath(procSelf, controller string) string {
	for _, line := range strings.Split(procSelf, "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if controller == "" && parts[0] == "0" && parts[1] == "" ||
			controller != "" && slices.Contains(strings.Split(parts[1], ","), controller) {
			return parts[2]
		}
	}
	return "/"
}

// within is mount/path when that directory exists (a process in a
// container may see a path of the host's), else mount.
func within(mount, path string) string {
	dir := filepath.Join(mount, path)
	if st, err := os.Stat(dir); err == nil && st.IsDir() {
		return dir
	}
	return mount
}

// makePods makes n cgroups under parent, named name-pod<i>, each with a
// CPU quota of quota every podsPeriod. On an error it removes those it
// made.
func makePods(parent string, v2 bool, name string, n int, quota time.Duration) ([]podCgroup, error) {
	if v2 {
		// Child cgroups get the cpu controller only if their parent hands it down.
		ctl, _ := os.ReadFile(filepath.Join(parent, "cgroup.subtree_control"))
		if !slices.Contains(strings.Fields(string(ctl)), "cpu") {
			if err := os.WriteFile(filepath.Join(parent, "cgroup.subtree_control"), []byte("+cpu"), 0); err != nil {
				return nil, fmt.Errorf("cannot hand the cpu controller down from %s: %w", parent, err)
			}
		}
	}
	var pods []podCgroup
	for i := range n {
		c := podCgroup{dir: filepath.Join(parent, fmt.Sprintf("%s-pod%d", name, i)), v2: v2}
		if err := os.Mkdir(c.dir, 0o755); err != nil {
			removePods(pods)
			if errors.Is(err, os.ErrPermission) {
				return nil, fmt.Errorf("cannot make a cgroup (it takes root, or a cgroup delegated to this user): %w", err)
			}
			return nil, fmt.Errorf("cannot make a cgroup: %w", err)
		}
		pods = append(pods, c)
		if err := c.limit(quota); err != nil {
			removePods(pods)
			return nil, err
		}
	}
	return pods, nil
}

// limit gives the cgroup a CPU quota of quota every podsPeriod.
func (c podCgroup) limit(quota time.Duration) error {
	q, per := quota.Microseconds(), podsPeriod.Microseconds()
	write := func(file, v string) error {
		if err := os.WriteFile(filepath.Join(c.dir, file), []byte(v), 0); err != nil {
			return fmt.Errorf("cannot set the cgroup's CPU quota: %w", err)
		}
		return nil
	}
	if c.v2 {
		return write("cpu.max", fmt.Sprintf("%d %d", q, per))
	}
	if err := write("cpu.cfs_period_us", strconv.FormatInt(per, 10)); err != nil {
		return err
	}
	return write("cpu.cfs_quota_us", strconv.FormatInt(q, 10))
}

// removePods removes the cgroups, waiting up to 2 s each for the
// kernel to let their exited processes go.
func removePods(pods []podCgroup) {
	for _, c := range pods {
		for deadline := time.Now().Add(2 * time.Second); ; {
			err := os.Remove(c.dir)
			if err == nil || errors.Is(err, os.ErrNotExist) || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
}

// cpuStat is what a cgroup's cpu.stat says of its quota: CFS periods,
// periods in which it was throttled, and time throttled.
type cpuStat struct {
	Periods, Throttled int64
	Time               time.Duration
}

func (c podCgroup) stat() (cpuStat, error) {
	raw, err := os.ReadFile(filepath.Join(c.dir, "cpu.stat"))
	if err != nil {
		return cpuStat{}, err
	}
	return parseCPUStat(string(raw)), nil
}

// parseCPUStat reads cpu.stat: v1's throttled_time is in ns, v2's
// throttled_usec in µs.
func parseCPUStat(text string) cpuStat {
	var s cpuStat
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) != 2 {
			continue
		}
		v, err := strconv.ParseInt(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "nr_periods":
			s.Periods = v
		case "nr_throttled":
			s.Throttled = v
		case "throttled_time":
			s.Time = time.Duration(v)
		case "throttled_usec":
			s.Time = time.Duration(v) * time.Microsecond
		}
	}
	return s
}

// readStats reads every pod's cpu.stat.
func readStats(pods []podCgroup) ([]cpuStat, error) {
	out := make([]cpuStat, len(pods))
	for i, c := range pods {
		s, err := c.stat()
		if err != nil {
			return nil, err
		}
		out[i] = s
	}
	return out, nil
}

// inPods runs one callers worker per spec, the i-th in the i-th pod: sh
// writes its own pid to the cgroup's cgroup.procs and then execs this
// binary, so that the Go runtime starts inside the pod and sees its
// limit, as a container's process does.
func inPods(ctx context.Context, pods []podCgroup, specs []callersSpec) ([]callersResult, error) {
	return workers.RunAs[callersSpec, callersResult](ctx, callersEnv, specs, func(i int, self string) []string {
		return []string{"sh", "-c", `echo $$ > "$1" && exec "$2"`, "sh", filepath.Join(pods[i].dir, "cgroup.procs"), self}
	})
}
