package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluicehq/sluice/bucket"
)

// sluice inspect: one read of the bucket from Redis (bucket.Inspect), which
// writes nothing, shown for a person or as JSON.

func runInspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var t target
	fs := t.flags("inspect", "[--redis URL] [--prefix P] [--watch] [--json] NAME",
		"Shows what bucket NAME is doing now, across every process: the policies in force\n"+
			"with each one's tokens and next refill, the callers queued, how long a new caller\n"+
			"would wait, which process runs the scheduler, and whether Adapt has slowed it.\n"+
			"It only reads: a bucket with no configuration stored is left without one.")
	asJSON := fs.Bool("json", false, "write one JSON object per inspection, one per line (fields: README, \"Inspect a bucket\")")
	watch := fs.Bool("watch", false, "inspect again every --interval until interrupted")
	interval := fs.Duration("interval", time.Second, "the time between inspections with --watch")
	pos, ok, err := parse(fs, args, stdout)
	if !ok {
		return err
	}
	name, err := oneName(fs, pos)
	if err != nil {
		return err
	}
	if *interval < 10*time.Millisecond {
		return usagef("inspect: --interval %v, want ≥ 10ms", *interval)
	}
	rdb, b, err := t.open(name, placeholder)
	if err != nil {
		return err
	}
	defer rdb.Close()
	defer b.Close()

	show := func() error {
		in, err := t.inspect(ctx, b, name)
		if err != nil {
			return err
		}
		r := newReport(name, t.prefix, in)
		if *asJSON {
			return json.NewEncoder(stdout).Encode(r)
		}
		return r.write(stdout)
	}
	if !*watch {
		return show()
	}
	clear := !*asJSON && isTerminal(stdout)
	tick := time.NewTicker(*interval)
	defer tick.Stop()
	for first := true; ; first = false {
		switch {
		case clear:
			fmt.Fprint(stdout, "\033[H\033[2J") // home, clear screen
		case !first && !*asJSON:
			fmt.Fprintln(stdout)
		}
		if err := show(); err != nil {
			if ctx.Err() != nil {
				return nil // interrupted during a read
			}
			fmt.Fprintln(stderr, "sluice inspect:", err) // keep watching: Redis may come back
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// report is an Inspection as --json writes it. The field names are stable;
// durations are whole microseconds (_us).
type report struct {
	Bucket string    `json:"bucket"`
	Prefix string    `json:"prefix"`
	Now    time.Time `json:"now"` // the Redis clock at the read
	// Stored is false when no configuration is stored: Policies is then
	// empty and WaitUS 0.
	Stored   bool          `json:"stored"`
	Policies []levelReport `json:"policies"`
	// Adapting is the share of the configured rate in force while Adapt
	// slows the bucket (0.85, 0.9, ...); 0 when it does not. Policies are
	// then the slowed ones.
	Adapting float64 `json:"adapting"`
	Queued   int     `json:"queued"`
	WaitUS   int64   `json:"wait_us"` // a new caller's wait for its slot, in the default lane
	// Lanes are the lanes with callers while named lanes have some, the
	// most callers first (at most 20); OtherLanes is how many more lanes
	// have callers, and OtherQueued their callers.
	Lanes       []laneReport `json:"lanes"`
	OtherLanes  int          `json:"other_lanes"`
	OtherQueued int          `json:"other_queued"`
	// Scheduler is the process ("host:pid") holding the scheduler lock,
	// "" when none does; SchedulerTTLUS is how long the lock lasts unless
	// renewed.
	Scheduler      string `json:"scheduler"`
	SchedulerTTLUS int64  `json:"scheduler_ttl_us"`
	Format         int    `json:"format"` // the state's format; 0: no state (full and idle)
}

// laneReport is one lane with callers.
type laneReport struct {
	Name     string `json:"name"` // "" for the default lane
	Priority int    `json:"priority"`
	Queued   int    `json:"queued"`
	WaitUS   int64  `json:"wait_us"` // a new caller's wait for its slot, in this lane
}

// levelReport is one policy in force and its level.
type levelReport struct {
	policyJSON
	// Tokens are free now; negative: owed to slots already handed out.
	Tokens int64 `json:"tokens"`
	// NextRefillUS is the time to the next refill, 0 when full.
	NextRefillUS int64 `json:"next_refill_us"`
}

func newReport(name, prefix string, in bucket.Inspection) report {
	r := report{
		Bucket:         name,
		Prefix:         prefix,
		Now:            in.Now.UTC(),
		Stored:         in.Stored,
		Policies:       []levelReport{},
		Adapting:       in.Adapting,
		Queued:         in.Queued,
		Lanes:          []laneReport{},
		OtherLanes:     in.OtherLanes,
		OtherQueued:    in.OtherQueued,
		Scheduler:      in.Scheduler,
		SchedulerTTLUS: in.SchedulerTTL.Microseconds(),
		Format:         in.Format,
	}
	if !in.Stored {
		return r // in's policies are this handle's placeholder, not the bucket's
	}
	r.WaitUS = in.Wait.Microseconds()
	for _, l := range in.Lanes {
		r.Lanes = append(r.Lanes, laneReport{Name: l.Name, Priority: l.Priority, Queued: l.Queued, WaitUS: l.Wait.Microseconds()})
	}
	for i, p := range in.Policies {
		l := levelReport{policyJSON: toJSON(p)}
		if i < len(in.Levels) {
			l.Tokens, l.NextRefillUS = in.Levels[i].Tokens, in.Levels[i].NextRefill.Microseconds()
		}
		r.Policies = append(r.Policies, l)
	}
	return r
}

func us(n int64) time.Duration { return time.Duration(n) * time.Microsecond }

// write shows r to a person.
func (r report) write(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "bucket %q (prefix %q) at %s, Redis clock\n", r.Bucket, r.Prefix, r.Now.Format("2006-01-02 15:04:05.000 MST"))
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	if !r.Stored {
		fmt.Fprintln(tw, noConfig)
	} else {
		fmt.Fprintln(tw, "policies in force:")
		fmt.Fprintln(tw, "  unit\tcapacity\trefill\trate\ttokens\tnext refill")
		owed := false
		for _, l := range r.Policies {
			p := bucket.Policy{Unit: l.Unit, Capacity: l.Capacity, RefillAmount: l.RefillAmount, RefillFrequency: us(l.RefillEveryUS), Kind: kindOf(l.Kind)}
			next := "full"
			if l.NextRefillUS > 0 || l.Tokens < int64(l.Capacity) {
				next = fmt.Sprintf("+%d in %v", l.RefillAmount, round(us(l.NextRefillUS)))
			}
			owed = owed || l.Tokens < 0
			fmt.Fprintf(tw, "  %s\t%d\t%s\t%s\t%d\t%s\n", unitName(l.Unit), l.Capacity, refill(p), rate(p), l.Tokens, next)
		}
		if owed {
			fmt.Fprintln(tw, "  (negative tokens are owed to slots already handed out)")
		}
	}
	tw.Flush()
	tw = tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0) // the lines below align apart from the table
	fmt.Fprintf(tw, "queue:\t%s\n", plural(r.Queued, "caller", "callers")+" waiting, in every process")
	if r.Stored {
		fmt.Fprintf(tw, "new caller:\twould wait %v for its slot\n", round(us(r.WaitUS)))
	}

	if r.Scheduler == "" {
		fmt.Fprintln(tw, "scheduler:\tnone running (a waiting caller starts one)")
	} else {
		fmt.Fprintf(tw, "scheduler:\t%s, lock expires in %v unless renewed\n", r.Scheduler, round(us(r.SchedulerTTLUS)))
	}
	if r.Stored {
		if r.Adapting > 0 {
			fmt.Fprintf(tw, "adapt:\tslowed to %.0f%% of the configured rate by the upstream's refusals (the rates above are the slowed ones)\n", 100*r.Adapting)
		} else {
			fmt.Fprintln(tw, "adapt:\tnot slowed")
		}
	}
	if r.Format == 0 {
		fmt.Fprintln(tw, "state:\tnone (the bucket is full and idle)")
	} else {
		fmt.Fprintf(tw, "state:\tformat %d\n", r.Format)
	}
	tw.Flush()
	r.writeLanes(&b)
	_, err := io.WriteString(w, b.String())
	return err
}

// writeLanes shows the lanes with callers, when named lanes have some.
func (r report) writeLanes(b *strings.Builder) {
	if len(r.Lanes) == 0 {
		return
	}
	tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "lanes with callers, the most first:\n")
	fmt.Fprintln(tw, "  lane\tpriority\tqueued\ta new caller would wait")
	for _, l := range r.Lanes {
		name := l.Name
		if name == "" {
			name = "(default)"
		}
		fmt.Fprintf(tw, "  %s\t%d\t%d\t%v\n", name, l.Priority, l.Queued, round(us(l.WaitUS)))
	}
	if r.OtherLanes > 0 {
		fmt.Fprintf(tw, "  %s\t\t%d\n", plural(r.OtherLanes, "other lane", "other lanes"), r.OtherQueued)
	}
	tw.Flush()
}

// round keeps the digits of d a person reads: µs below 10 ms, ms above.
func round(d time.Duration) time.Duration {
	switch {
	case d >= 10*time.Second:
		return d.Round(100 * time.Millisecond)
	case d >= 10*time.Millisecond:
		return d.Round(time.Millisecond)
	default:
		return d.Round(10 * time.Microsecond)
	}
}

func plural(n int, one, many string) string {
	if n == 1 {
		return "1 " + one
	}
	return fmt.Sprintf("%d %s", n, many)
}
