package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// Report is everything one run measured.
type Report struct {
	Machine   Machine    `json:"machine"`
	Redis     RedisInfo  `json:"redis"`
	Limit     Limit      `json:"limit"`
	Overhead  *Overhead  `json:"overhead,omitempty"`
	Scripts   *Scripts   `json:"scripts,omitempty"`
	Saturate  *Saturate  `json:"saturate,omitempty"`
	Semaphore *Semaphore `json:"semaphore,omitempty"`
	Compare   *Compare   `json:"compare,omitempty"`
	Scale     *Scale     `json:"scale,omitempty"`
	Chaos     *Chaos     `json:"chaos,omitempty"`
}

// Machine is where the run happened.
type Machine struct {
	OS         string    `json:"os"`
	Arch       string    `json:"arch"`
	CPUs       int       `json:"cpus"`
	GOMAXPROCS int       `json:"gomaxprocs"`
	Go         string    `json:"go"`
	Host       string    `json:"host"`
	Time       time.Time `json:"time"`
}

// RedisInfo is the server the run used.
type RedisInfo struct {
	Server  string `json:"server"`
	Version string `json:"version"`
	// Fake is true for the in-process miniredis fallback: figures are not
	// representative.
	Fake bool `json:"fake"`
}

// Limit is the saturated bucket's configuration.
type Limit struct {
	Capacity        int           `json:"capacity"`
	RefillAmount    int           `json:"refill_amount"`
	RefillFrequency time.Duration `json:"refill_frequency_ns"`
	PerSecond       float64       `json:"per_second"`
}

func writeJSON(w io.Writer, r Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// writeTable writes the report for people: one aligned table per scenario.
func writeTable(w io.Writer, r Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	m := r.Machine
	if r.Redis.Fake {
		fmt.Fprintln(tw, "!!! IN-PROCESS MINIREDIS, NOT redis-server: THESE FIGURES ARE NOT REPRESENTATIVE !!!")
	}
	fmt.Fprintf(tw, "machine: %s/%s, %d CPUs (GOMAXPROCS %d), %s, %s\n", m.OS, m.Arch, m.CPUs, m.GOMAXPROCS, m.Go, m.Time.Format(time.RFC3339))
	fmt.Fprintf(tw, "redis:   %s, %s\n", r.Redis.Version, r.Redis.Server)
	// Every row has the same cells, so that one table lines up.
	row := func(name, a, b, c, note string) { fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", name, a, b, c, note) }
	dist := func(name string, d Dist, note string) { row(name, dur(d.P50), dur(d.P99), dur(d.Max), note) }
	val := func(name, v, note string) { row(name, v, "", "", note) }
	if o := r.Overhead; o != nil {
		fmt.Fprintln(tw)
		fmt.Fprintln(tw, "OVERHEAD: one process, bucket limit far above reach")
		row("", "p50", "p99", "max", "")
		dist("PING round trip", o.Ping, fmt.Sprintf("%s sequential calls each", commas(o.Samples)))
		dist("script round trip (EVALSHA return 1)", o.Script, "")
		dist("Enter, uncontended", o.Enter, fmt.Sprintf("p50 = %.2f × script p50; %.2f round trips/Enter (Report.RoundTrips)", o.EnterOverScript, o.RoundTripsPerEnter))
		for _, a := range o.Admit {
			row(fmt.Sprintf("%s Enters at once: last returns after", commas(a.Callers)), dur(a.Last.P50), "", dur(a.Last.Max),
				fmt.Sprintf("median and max of %d rounds; %d errors", a.Rounds, a.Errors))
		}
		h := o.Hammer
		dist(fmt.Sprintf("%d callers looping Enter: latency", h.Callers), h.Enter, "")
		val(fmt.Sprintf("%d callers looping Enter: grants/s", h.Callers), commas(int(h.PerSecond+0.5)),
			fmt.Sprintf("%s grants in %v; %.3f round trips/grant (hook: arrivals are batched); %d errors", commas(h.Grants), h.Duration, h.RoundTripsPerGrant, h.Errors))
	}
	if sc := r.Scripts; sc != nil && len(sc.Rows) > 0 {
		fmt.Fprintln(tw)
		fmt.Fprintf(tw, "SCRIPTS: Redis time per call (INFO commandstats), %s back to back, then %s one every %v\n", commas(sc.Tight), commas(sc.Paced), sc.Pace)
		row("", "tight", "paced", "", "")
		floor := sc.Rows[0]
		for _, c := range sc.Rows {
			note := c.Runs
			if c.Name != floor.Name && floor.Tight > 0 && floor.Paced > 0 {
				note = fmt.Sprintf("%.1f× / %.1f× the one-line script; %s", c.Tight/floor.Tight, c.Paced/floor.Paced, c.Runs)
			}
			row(c.Name, usec(c.Tight), usec(c.Paced), "", note)
		}
	}
	if s := r.Saturate; s != nil {
		l := r.Limit
		fmt.Fprintln(tw)
		fmt.Fprintf(tw, "SATURATE: %d callers in %d process(es) loop Enter for %v on one bucket: capacity %d, %d every %v = %s/s\n",
			s.Callers, s.Procs, s.Duration, l.Capacity, l.RefillAmount, l.RefillFrequency, num(l.PerSecond))
		row("", "value", "", "", "")
		note := fmt.Sprintf("%d errors", s.Errors)
		if s.Err != "" {
			note += "; first: " + s.Err
		}
		val("grants", commas(s.Grants), note)
		t := s.Throughput
		val("rate after the initial burst", num(t.Rate)+"/s", fmt.Sprintf("(grants − capacity) / %.3f s from first to last slot", t.Span.Seconds()))
		val("utilization", fmt.Sprintf("%.2f %%", 100*t.Utilization), fmt.Sprintf("rate / limit (%s/s)", num(t.Limit)))
		val("worst excess, slots (Redis clock)", excess(s.ExcessSlots), windows(s.ExcessSlots))
		val("worst excess, start times", excess(s.ExcessStarts), windows(s.ExcessStarts))
		val("worst excess, start times, slack", excess(Excess{All: s.ExcessStartsSlack}), fmt.Sprintf("windows judged MaxLateness + %v longer", startSlack))
		val("wait max / median", fmt.Sprintf("%.3f", s.MaxOverMedian), "queued callers, steady state")
		val("grants overtaken, by slot", pct(s.OvertakenSlot, s.Grants), fmt.Sprintf("%d grants whose slot a later ticket's slot preceded", s.OvertakenSlot))
		val("grants overtaken, by start", pct(s.OvertakenStart, s.Grants), fmt.Sprintf("%d grants a later ticket started > %v before", s.OvertakenStart, s.StartTol))
		val("polls per queued waiter", fmt.Sprintf("%.3f", s.PollsPerQueued), fmt.Sprintf("%s queued grants; max %d polls", commas(s.Queued), s.MaxPolls))
		val("round trips per grant, all", fmt.Sprintf("%.3f", s.RoundTripsPerGrant()), fmt.Sprintf("%s commands and pipelines sent by all processes; connection handshakes (%s) left out", commas(int(s.RoundTrips)), commas(int(s.SetupRoundTrips))))
		val("round trips per grant, callers", fmt.Sprintf("%.3f", s.CallerRoundTripsPerGrant()), "Report.RoundTrips: calls each caller waited on; a batched enqueue counts for every caller in it")
		val("returned > 100 µs before slot", commas(s.Early), "")
		val("returned > MaxLateness after slot", commas(s.Tardy), fmt.Sprintf("MaxLateness %v", s.MaxLateness))
		val("re-entries", commas(s.Reentries), fmt.Sprintf("%d grants re-entered at least once", s.ReenteredCalls))
		val("scheduler steps", commas(int(s.Steps)), fmt.Sprintf("fenced %d, errors %d", s.Fenced, s.SchedulerErrors))
		if m := s.Machine; m != nil {
			val("machine CPUs during the run", m.String(), "/proc/stat, all CPUs: stolen = time the hypervisor ran other VMs; tails grow with both")
		}
		if c := s.RedisCPU; c != nil {
			shared := "server used by this run only"
			if c.Shared {
				shared = "SHARED server (--redis): other clients count too, an upper bound"
			}
			verdict := "ok"
			if c.PerGrant > redisCPUGoal {
				verdict = "MISSED"
			}
			val("Redis time per grant, commands", dur(c.PerGrant), fmt.Sprintf("goal ≤ %s %s; INFO commandstats Δ usec %s (scripts %s) / grants, inner commands not counted twice; %s",
				dur(redisCPUGoal), verdict, dur(time.Duration(c.CommandsUsec)*time.Microsecond), dur(time.Duration(c.ScriptsUsec)*time.Microsecond), shared))
			val("Redis CPU per grant, process", dur(c.ProcessCPUPerGrant), fmt.Sprintf("INFO used_cpu_sys + used_cpu_user Δ %s / grants: all threads, I/O and event loop included", dur(c.ProcessCPU)))
			val("  costliest commands", "", c.topString(4))
			if c.FloorUsec > 0 {
				val("  one-line script, same pace", dur(time.Duration(c.FloorUsec*float64(time.Microsecond))),
					fmt.Sprintf("EVAL %q sent alone, one per 4 grants, during the run: a grant costs Redis %.1f of them", floorScript, c.PerGrantFloors))
			}
		}
		row("", "p50", "p99", "max", "")
		dist("wait, queued callers, steady state", s.Wait, fmt.Sprintf("%s Enters begun ≥ %v after the first", commas(s.Wait.N), s.Warmup.Round(time.Millisecond)))
		dist("lateness: Enter return − slot", s.Late, "all grants")
		dist("lateness, steady state", s.LateSteady, fmt.Sprintf("%s Enters begun ≥ %v after the first", commas(s.LateSteady.N), s.Warmup.Round(time.Millisecond)))
		dist("  of those answered before the slot", s.LateInTime, fmt.Sprintf("the final wait's own lateness; %s answered at or after their slot (Report.Margin ≤ 0)", commas(s.LateAnswer)))
	}
	if sm := r.Semaphore; sm != nil {
		fmt.Fprintln(tw)
		fmt.Fprintf(tw, "SEMAPHORE: internal/semabench, %d clients (one per simulated process, all in this process); goals of issue 5\n", sm.Clients)
		row("", "value", "goal", "", "")
		for _, x := range sm.Rows {
			mark := ""
			if x.Goal != "" {
				mark = "ok"
				if !x.OK {
					mark = "MISSED"
				}
			}
			row(x.Metric, x.Value, x.Goal, mark, "")
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if c := r.Compare; c != nil {
		if err := writeCompare(w, c); err != nil {
			return err
		}
	}
	if sc := r.Scale; sc != nil {
		if err := writeScale(w, sc); err != nil {
			return err
		}
	}
	if c := r.Chaos; c != nil {
		return writeChaos(w, c, r.Limit)
	}
	return nil
}

// writeCompare writes the side-by-side table of the compare scenario: each
// contender's figure and its ratio to Sluice's.
func writeCompare(w io.Writer, c *Compare) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	l := c.Limit
	fmt.Fprintln(tw)
	fmt.Fprintf(tw, "COMPARE: the same workloads in this run, one process each; (×) is the ratio to sluice; saturated: %d callers loop for %v on capacity %d, %d every %v = %s/s\n",
		c.Callers, c.Duration, l.Capacity, l.RefillAmount, l.RefillFrequency, num(l.PerSecond))
	res := c.Results
	if len(res) == 0 {
		return tw.Flush()
	}
	header := []string{""}
	for _, r := range res {
		header = append(header, r.Name)
	}
	fmt.Fprintf(tw, "  %s\t\n", strings.Join(header, "\t"))
	// cells writes one row: v(r) formatted by f, with the ratio to the
	// first (Sluice) when ratio is set.
	cells := func(name string, v func(CompareResult) float64, format func(float64) string, ratio bool) {
		out := []string{name}
		base := v(res[0])
		for i, r := range res {
			x := v(r)
			cell := format(x)
			if ratio && i > 0 {
				if base != 0 {
					cell += fmt.Sprintf(" (%s×)", ratioString(x/base))
				} else {
					cell += " (—)"
				}
			}
			out = append(out, cell)
		}
		fmt.Fprintf(tw, "  %s\t\n", strings.Join(out, "\t"))
	}
	d := func(x float64) string { return dur(time.Duration(x)) }
	f3 := func(x float64) string { return fmt.Sprintf("%.3f", x) }
	cells("uncontended call, p50", func(r CompareResult) float64 { return float64(r.Uncontended.P50) }, d, true)
	cells("uncontended call, p99", func(r CompareResult) float64 { return float64(r.Uncontended.P99) }, d, true)
	for i, a := range res[0].Admit {
		cells(fmt.Sprintf("%s at once: last returns, median", commas(a.Callers)), func(r CompareResult) float64 { return float64(r.Admit[i].Last.P50) }, d, true)
	}
	h := res[0].Hammer
	cells(fmt.Sprintf("grants/s, %d callers, no limit in reach", h.Callers), func(r CompareResult) float64 { return r.Hammer.PerSecond }, func(x float64) string { return commas(int(x + 0.5)) }, true)
	cells("  round trips per grant", func(r CompareResult) float64 { return r.Hammer.RoundTripsPerGrant }, f3, true)
	cells("saturated: grants", func(r CompareResult) float64 { return float64(r.Saturated.Grants) }, func(x float64) string { return commas(int(x)) }, false)
	cells("  utilization", func(r CompareResult) float64 { return r.Saturated.Throughput.Utilization }, func(x float64) string { return fmt.Sprintf("%.2f %%", 100*x) }, true)
	cells("  worst excess (return times)", func(r CompareResult) float64 { return float64(r.Saturated.Excess.All) }, func(x float64) string { return excess(Excess{All: int(x)}) }, false)
	cells(fmt.Sprintf("  worst excess, windows +%v", bucketSlack()), func(r CompareResult) float64 { return float64(r.Saturated.ExcessSlack) }, func(x float64) string { return excess(Excess{All: int(x)}) }, false)
	cells("  wait p50 (steady)", func(r CompareResult) float64 { return float64(r.Saturated.Wait.P50) }, d, true)
	cells("  wait max (steady)", func(r CompareResult) float64 { return float64(r.Saturated.Wait.Max) }, d, true)
	cells("  wait max / median", func(r CompareResult) float64 { return r.Saturated.MaxOverMedian }, f3, true)
	cells("  overtaken (by a later call)", func(r CompareResult) float64 { return 100 * ratio(r.Saturated.Overtaken, r.Saturated.Grants) }, func(x float64) string { return fmt.Sprintf("%.2f %%", x) }, false)
	cells("  round trips per grant", func(r CompareResult) float64 { return r.Saturated.RoundTripsPerGrant() }, f3, true)
	cells("  cut off at the end", func(r CompareResult) float64 { return float64(r.Saturated.CutOff) }, func(x float64) string { return commas(int(x)) }, false)
	cells("  errors", func(r CompareResult) float64 { return float64(r.Saturated.Errors) }, func(x float64) string { return commas(int(x)) }, false)
	return tw.Flush()
}

// bucketSlack is how much longer the slack windows are: Sluice's
// MaxLateness default and the reply's trip.
func bucketSlack() time.Duration { return defaultMaxLateness + startSlack }

// ratioString formats a ratio with two or three significant digits.
func ratioString(x float64) string {
	switch {
	case x >= 100:
		return fmt.Sprintf("%.0f", x)
	case x >= 10:
		return fmt.Sprintf("%.1f", x)
	case x >= 0.01:
		return fmt.Sprintf("%.2f", x)
	}
	return fmt.Sprintf("%.2g", x)
}

// writeScale writes the scale scenario's table.
func writeScale(w io.Writer, s *Scale) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw)
	fmt.Fprintf(tw, "SCALE: %s callers in %d processes Enter once on one bucket, arriving over %v, deadline %v\n",
		commas(s.Callers), s.Procs, s.Stagger, s.Deadline)
	row := func(name, v, note string) { fmt.Fprintf(tw, "  %s\t%s\t%s\n", name, v, note) }
	verdict := "ok"
	if s.PerWaiter > scaleGoalBytes {
		verdict = "MISSED"
	}
	row("callers queued at the peak", commas(int(s.QueuedPeak)), fmt.Sprintf("LLEN of the queue key, sampled every %v (%d samples as it grew)", scaleSample, s.Samples))
	row("Redis memory per waiting caller", fmt.Sprintf("%.0f B", s.PerWaiter), fmt.Sprintf("goal ≤ %d B %s: INFO used_memory Δ %s B / queued", scaleGoalBytes, verdict, commas(int(s.UsedMemory))))
	row("  less connection buffers", fmt.Sprintf("%.0f B", s.PerWaiterData), fmt.Sprintf("(used_memory Δ − mem_clients_normal Δ %s B of %d more connections) / queued", commas(int(s.ClientMemory)), s.Connections))
	row("  the queue key alone", fmt.Sprintf("%.0f B", s.PerWaiterQueue), fmt.Sprintf("MEMORY USAGE %s B / queued", commas(int(s.QueueKeyMemory))))
	note := fmt.Sprintf("%s left at their deadline; %d errors", commas(s.Deadlines), s.Errors)
	if s.Err != "" {
		note += "; first: " + s.Err
	}
	row("grants", commas(s.Grants), note)
	row("worst excess, slots (Redis clock)", excess(s.ExcessSlots), windows(s.ExcessSlots))
	row("worst excess, start times", excess(s.ExcessStarts), windows(s.ExcessStarts))
	row("worst excess, start times, slack", excess(Excess{All: s.ExcessStartsSlack}), fmt.Sprintf("windows judged MaxLateness + %v longer", startSlack))
	row("utilization", fmt.Sprintf("%.2f %%", 100*s.Throughput.Utilization), fmt.Sprintf("rate after the initial burst %s/s", num(s.Throughput.Rate)))
	row("grants overtaken, by slot", pct(s.OvertakenSlot, s.Grants), "")
	row("polls per queued waiter (granted)", fmt.Sprintf("%.3f", s.PollsPerQueued), fmt.Sprintf("%s queued grants; max %d polls", commas(s.Queued), s.MaxPolls))
	row("polls per caller (all)", fmt.Sprintf("%.3f", s.PollsPer), fmt.Sprintf("%s polls by %s callers, those that left included", commas(s.Polls), commas(s.Callers)))
	row("round trips per grant, all", fmt.Sprintf("%.3f", s.RoundTripsPerGrant()), fmt.Sprintf("%s sent by all processes (cancellations included); handshakes (%s) left out", commas(int(s.RoundTrips)), commas(int(s.SetupRoundTrips))))
	row("round trips per caller, all", fmt.Sprintf("%.3f", per(s.RoundTrips, s.Callers)), fmt.Sprintf("scheduler steps %s", commas(int(s.Steps))))
	row("wait of queued grants p50 / p99 / max", fmt.Sprintf("%s / %s / %s", dur(s.Wait.P50), dur(s.Wait.P99), dur(s.Wait.Max)), "every caller arrives once: no steady state")
	row("lateness p50 / p99 / max", fmt.Sprintf("%s / %s / %s", dur(s.Late.P50), dur(s.Late.P99), dur(s.Late.Max)), fmt.Sprintf("%d returned > MaxLateness after slot, %d re-entries", s.Tardy, s.Reentries))
	return tw.Flush()
}

// writeGobench writes the figures as Go benchmark results, for benchstat.
func writeGobench(w io.Writer, r Report) error {
	var b strings.Builder
	fmt.Fprintf(&b, "goos: %s\ngoarch: %s\npkg: github.com/sluicehq/sluice/cmd/bench\n", r.Machine.OS, r.Machine.Arch)
	fmt.Fprintf(&b, "redis: %s\n", r.Redis.Version)
	if r.Redis.Fake {
		fmt.Fprintf(&b, "redis-server: miniredis-not-representative\n")
	}
	line := func(name string, n int, metrics ...any) {
		fmt.Fprintf(&b, "Benchmark%s %d", name, max(n, 1))
		for i := 0; i+1 < len(metrics); i += 2 {
			fmt.Fprintf(&b, " %v %s", metrics[i], metrics[i+1])
		}
		b.WriteByte('\n')
	}
	ns := func(d time.Duration) int64 { return int64(d) }
	if o := r.Overhead; o != nil {
		line("Overhead/ping", o.Ping.N, ns(o.Ping.P50), "ns/op", ns(o.Ping.P99), "p99-ns/op")
		line("Overhead/script", o.Script.N, ns(o.Script.P50), "ns/op", ns(o.Script.P99), "p99-ns/op")
		line("Overhead/enter", o.Enter.N, ns(o.Enter.P50), "ns/op", ns(o.Enter.P99), "p99-ns/op",
			f(o.EnterOverScript), "x-script", f(o.RoundTripsPerEnter), "round-trips/op")
		for _, a := range o.Admit {
			line(fmt.Sprintf("Overhead/admit-%d", a.Callers), a.Rounds, ns(a.Last.P50), "ns/burst", ns(a.Last.Max), "max-ns/burst")
		}
		h := o.Hammer
		line(fmt.Sprintf("Overhead/hammer-%d", h.Callers), h.Grants, f(h.PerSecond), "grants/s", ns(h.Enter.P50), "ns/op",
			ns(h.Enter.P99), "p99-ns/op", f(h.RoundTripsPerGrant), "round-trips/op")
	}
	if sc := r.Scripts; sc != nil {
		for _, c := range sc.Rows {
			line("Scripts/"+strings.NewReplacer(" ", "-", ",", "").Replace(c.Name), sc.Tight, f(c.Tight), "redis-us/op", f(c.Paced), "paced-redis-us/op")
		}
	}
	if s := r.Saturate; s != nil {
		line("Saturate", s.Grants,
			f(s.Throughput.Utilization), "utilization",
			f(s.Throughput.Rate), "grants/s",
			s.ExcessSlots.All, "excess-slots",
			s.ExcessStarts.All, "excess-starts",
			s.ExcessStartsSlack, "excess-starts-slack",
			ms(s.Wait.P50), "ms-wait-p50",
			ms(s.Wait.P99), "ms-wait-p99",
			ms(s.Wait.Max), "ms-wait-max",
			f(s.MaxOverMedian), "max/median",
			f(100*ratio(s.OvertakenSlot, s.Grants)), "pct-overtaken-slot",
			f(100*ratio(s.OvertakenStart, s.Grants)), "pct-overtaken-start",
			f(s.PollsPerQueued), "polls/waiter",
			f(s.RoundTripsPerGrant()), "round-trips/op",
			ms(s.Late.P50), "ms-late-p50",
			ms(s.Late.P99), "ms-late-p99",
			ms(s.LateSteady.P99), "ms-late-steady-p99",
			s.Tardy, "tardy",
			s.Reentries, "reentries",
			s.Errors, "errors")
		if c := s.RedisCPU; c != nil {
			line("Saturate/redis-cpu", s.Grants, f(float64(c.PerGrant)/float64(time.Microsecond)), "redis-us/op",
				f(float64(c.ProcessCPUPerGrant)/float64(time.Microsecond)), "redis-process-cpu-us/op",
				f(c.FloorUsec), "one-line-script-us", f(c.PerGrantFloors), "one-line-scripts/op")
		}
	}
	if sm := r.Semaphore; sm != nil {
		line("Semaphore/burst", sm.Burst, ns(sm.BurstMedian), "ns/burst", ns(sm.BurstMax), "max-ns/burst")
		line("Semaphore/saturated", sm.Holds, f(sm.HoldsPerSec), "holds/s", f(sm.Utilization), "utilization",
			ms(sm.WaitP50), "ms-wait-p50", ms(sm.WaitP99), "ms-wait-p99", ms(sm.WaitP99-sm.WaitIdeal), "ms-p99-over-ideal",
			sm.Violations, "violations", sm.Lost, "lost", sm.Errors, "errors")
	}
	if c := r.Compare; c != nil {
		for _, x := range c.Results {
			name := "Compare/" + x.Key
			line(name+"/uncontended", x.Uncontended.N, ns(x.Uncontended.P50), "ns/op", ns(x.Uncontended.P99), "p99-ns/op")
			for _, a := range x.Admit {
				line(fmt.Sprintf("%s/admit-%d", name, a.Callers), a.Rounds, ns(a.Last.P50), "ns/burst", ns(a.Last.Max), "max-ns/burst")
			}
			h := x.Hammer
			line(fmt.Sprintf("%s/hammer-%d", name, h.Callers), h.Grants, f(h.PerSecond), "grants/s", f(h.RoundTripsPerGrant), "round-trips/op")
			s := x.Saturated
			line(name+"/saturated", s.Grants, f(s.Throughput.Utilization), "utilization", s.Excess.All, "excess", s.ExcessSlack, "excess-slack",
				ms(s.Wait.P50), "ms-wait-p50", ms(s.Wait.Max), "ms-wait-max", f(s.MaxOverMedian), "max/median",
				f(100*ratio(s.Overtaken, s.Grants)), "pct-overtaken", f(s.RoundTripsPerGrant()), "round-trips/op", s.CutOff, "cut-off", s.Errors, "errors")
		}
	}
	if s := r.Scale; s != nil {
		line("Scale", s.Callers, s.QueuedPeak, "queued", f(s.PerWaiter), "B/waiter", f(s.PerWaiterData), "B/waiter-data",
			f(s.PerWaiterQueue), "B/waiter-queue-key", s.ExcessSlots.All, "excess-slots", s.ExcessStarts.All, "excess-starts",
			f(s.PollsPerQueued), "polls/waiter", f(s.PollsPer), "polls/caller", f(s.RoundTripsPerGrant()), "round-trips/op",
			f(per(s.RoundTrips, s.Callers)), "round-trips/caller", s.Grants, "grants", s.Deadlines, "deadlines", s.Errors, "errors")
	}
	if c := r.Chaos; c != nil {
		total := 0
		for _, n := range c.Errors {
			total += n
		}
		line("Chaos", c.Enters, c.Grants, "grants", c.ExcessSlots, "excess-slots", c.ExcessStart, "excess-starts-slack",
			c.Hangs, "hangs", c.Lost, "lost", total, "errors", len(c.Faults), "faults", c.Restarts, "restarts")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func f(x float64) string { return strconv.FormatFloat(x, 'g', 6, 64) }

func ms(d time.Duration) string { return f(float64(d) / float64(time.Millisecond)) }

func ratio(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func pct(a, b int) string { return fmt.Sprintf("%.2f %%", 100*ratio(a, b)) }

// dur formats a duration with three significant digits and a unit.
func dur(d time.Duration) string {
	a := d
	if a < 0 {
		a = -a
	}
	switch {
	case a == 0:
		return "0"
	case a < time.Millisecond:
		return fmt.Sprintf("%.3g µs", float64(d)/float64(time.Microsecond))
	case a < time.Second:
		return fmt.Sprintf("%.3g ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.3g s", d.Seconds())
}

// num formats a rate: no decimals from 100 up.
func num(x float64) string {
	if x >= 100 {
		return commas(int(x + 0.5))
	}
	return strconv.FormatFloat(x, 'f', 2, 64)
}

// commas writes n with thousands separators.
func commas(n int) string {
	s := strconv.Itoa(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// excess formats the worst window over all windows: ≤ 0 held.
func excess(e Excess) string {
	if e.All > 0 {
		return fmt.Sprintf("+%d BROKEN", e.All)
	}
	return fmt.Sprintf("%d (held)", e.All)
}

func windows(e Excess) string {
	short := func(p *int) string {
		if p == nil {
			return "skipped"
		}
		return strconv.Itoa(*p)
	}
	return fmt.Sprintf("%d grants in %s; windows ≤ 1 s: %s, ≤ 100 ms: %s", e.Count, dur(e.Span), short(e.Sec), short(e.Tenth))
}

// usec formats a count of µs as a duration.
func usec(x float64) string { return dur(time.Duration(x * float64(time.Microsecond))) }
