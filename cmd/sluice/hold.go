package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/bucket"
)

// sluice hold: bucket.Hold from outside the fleet, for an operator whose
// upstream asked to back off.

func runHold(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var t target
	fs := t.flags("hold", "[--redis URL] [--prefix P] [--unit U ...] NAME DURATION",
		"Stops every process's grants from bucket NAME for DURATION (30s, 5m) from now, on\n"+
			"the Redis clock: of every policy, or of those counting the units --unit names.\n"+
			"Callers already queued are re-timed after the hold, in their order; after it the\n"+
			"bucket grants as if it had been empty when the hold ended, never a burst. Slots\n"+
			"already handed out (due within the lookahead, 20 ms by default) keep their times:\n"+
			"it says how many. Every policy held is empty at the hold's end, a long one (400,000\n"+
			"a month) too: --unit holds only the policies of the units that need it.")
	var units unitList
	fs.Var(&units, "unit", "hold only the policies counting `U` (repeatable; \"calls\" or \"\" is the policy counting calls)")
	pos, ok, err := parse(fs, args, stdout)
	if !ok {
		return err
	}
	if len(pos) != 2 {
		return usagef("hold: want NAME DURATION, got %q (see 'sluice hold --help')", pos)
	}
	name, err := oneName(fs, pos[:1])
	if err != nil {
		return err
	}
	d, err := time.ParseDuration(pos[1])
	if err != nil || d <= 0 {
		return usagef("hold: DURATION %q, want a positive duration such as 30s or 5m", pos[1])
	}

	// Read the policies in force first, and hold under them: a handle
	// whose own policies were a placeholder would store it, were none
	// stored, and with none stored there is nothing to hold.
	rdb, b, err := t.open(name, placeholder)
	if err != nil {
		return err
	}
	defer rdb.Close()
	defer b.Close()
	in, err := t.inspect(ctx, b, name)
	if err != nil {
		return err
	}
	if !in.Stored {
		return fmt.Errorf("bucket %q on %s: %s; nothing to hold", name, t.addr, noConfig)
	}
	held, err := units.resolve(in.Policies)
	if err != nil {
		return err
	}
	hb, err := bucket.New(rdb, bucket.Config{Name: name, KeyPrefix: t.prefix, Policies: in.Policies, Adopt: true})
	if err != nil {
		return err
	}
	defer hb.Close()
	hctx, cancel := context.WithTimeout(ctx, opTimeout)
	owed, err := hb.Hold(hctx, d, held...)
	cancel()
	if err != nil {
		return t.failed("holding", name, err)
	}
	which := "every policy"
	if len(held) > 0 {
		names := make([]string, len(held))
		for i, u := range held {
			names[i] = unitName(u)
		}
		which = "the policies counting " + strings.Join(names, ", ")
	}
	_, err = fmt.Fprintf(stdout, "bucket %q: held for %v from now (%s), until about %s on the Redis clock\n%s already handed out left standing (they start at their times)\n",
		name, d, which, in.Now.Add(d).UTC().Format("15:04:05.000 MST"), plural(owed, "slot", "slots"))
	return err
}

// unitList is the repeatable --unit.
type unitList []string

func (u *unitList) String() string { return strings.Join(*u, ",") }

func (u *unitList) Set(s string) error {
	*u = append(*u, s)
	return nil
}

// resolve maps each --unit to a unit some policy in ps counts: the unit
// itself, or "" for "calls" when no policy counts a unit named "calls".
func (u unitList) resolve(ps []bucket.Policy) ([]string, error) {
	counts := func(unit string) bool {
		return slices.ContainsFunc(ps, func(p bucket.Policy) bool { return p.Unit == unit })
	}
	var out []string
	for _, s := range u {
		switch {
		case counts(s):
			out = append(out, s)
		case s == "calls" && counts(""):
			out = append(out, "")
		default:
			have := make([]string, 0, len(ps))
			for _, p := range ps {
				if n := unitName(p.Unit); !slices.Contains(have, n) {
					have = append(have, n)
				}
			}
			return nil, usagef("hold: --unit %q: no policy in force counts it (they count %s)", s, strings.Join(have, ", "))
		}
	}
	return out, nil
}
