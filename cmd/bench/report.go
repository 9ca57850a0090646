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
	Machine  Machine   `json:"machine"`
	Redis    RedisInfo `json:"redis"`
	Limit    Limit     `json:"limit"`
	Overhead *Overhead `json:"overhead,omitempty"`
	Saturate *Saturate `json:"saturate,omitempty"`
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
		row("", "p50", "p99", "max", "")
		dist("wait, queued callers, steady state", s.Wait, fmt.Sprintf("%s Enters begun ≥ %v after the first", commas(s.Wait.N), s.Warmup.Round(time.Millisecond)))
		dist("lateness: Enter return − slot", s.Late, "all grants")
		dist("lateness, steady state", s.LateSteady, fmt.Sprintf("%s Enters begun ≥ %v after the first", commas(s.LateSteady.N), s.Warmup.Round(time.Millisecond)))
	}
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
