package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/sluicehq/sluice/bucket"
)

// sluice policies and sluice set-policies: the policies in force, read (with
// Inspect, which never stores any) and changed (bucket.SetPolicies).

func runPolicies(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var t target
	fs := t.flags("policies", "[--redis URL] [--prefix P] [--json] NAME",
		"Shows the policies in force for bucket NAME, as every process enforces them.\n"+
			"It only reads: a bucket with no configuration stored is left without one.")
	asJSON := fs.Bool("json", false, `write a JSON object: {"bucket", "prefix", "stored", "policies": [{"unit", "capacity", "refill_amount", "refill_every_us", "rate_per_second"}], "adapting"}`)
	pos, ok, err := parse(fs, args, stdout)
	if !ok {
		return err
	}
	name, err := oneName(fs, pos)
	if err != nil {
		return err
	}
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
	if *asJSON {
		l := limitsJSON{Bucket: name, Prefix: t.prefix, Stored: in.Stored, Policies: []policyJSON{}, Adapting: in.Adapting}
		if in.Stored {
			for _, p := range in.Policies {
				l.Policies = append(l.Policies, toJSON(p))
			}
		}
		return json.NewEncoder(stdout).Encode(l)
	}
	if !in.Stored {
		_, err := fmt.Fprintf(stdout, "bucket %q: %s\n", name, noConfig)
		return err
	}
	var s strings.Builder
	fmt.Fprintf(&s, "bucket %q: policies in force\n", name)
	for _, p := range in.Policies {
		fmt.Fprintf(&s, "  %s\n", summary(p))
	}
	if in.Adapting > 0 {
		fmt.Fprintf(&s, "slowed to %.0f%% of the configured rate by Adapt (set-policies ends it)\n", 100*in.Adapting)
	}
	_, err = io.WriteString(stdout, s.String())
	return err
}

// limitsJSON is `sluice policies --json`; the names are stable.
type limitsJSON struct {
	Bucket   string       `json:"bucket"`
	Prefix   string       `json:"prefix"`
	Stored   bool         `json:"stored"`
	Policies []policyJSON `json:"policies"`
	Adapting float64      `json:"adapting"`
}

// carryRules are --carry's values.
var carryRules = map[string]bucket.Carry{
	"proportional": bucket.Proportionally,
	"as-is":        bucket.AsIs,
	"fill":         bucket.Fill,
}

func runSetPolicies(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var t target
	fs := t.flags("set-policies", "[--redis URL] [--prefix P] [--carry RULE] (--rate N/PERIOD --burst B | --policy SPEC ...) NAME",
		"Replaces every policy of bucket NAME, for every process at once: callers already\n"+
			"queued are re-timed under the new policies, and processes follow them at their next\n"+
			"call. Give every policy the bucket should have: --rate/--burst for the one counting\n"+
			"calls, and --policy for each other (or all of them), in order. It ends Adapt's slowing.\n\n"+
			"Examples:\n"+
			"  sluice set-policies --rate 200/1s --burst 50 api\n"+
			"  sluice set-policies --rate 1000/1m --burst 1000 \\\n"+
			"      --policy unit=pu,capacity=1000,refill_amount=1,refill_frequency=60ms sentinel-hub")
	carry := fs.String("carry", "proportional", "`RULE`: how each policy's free tokens carry over (bucket.Carry): proportional (scaled by new ÷ old capacity), as-is (kept, at most the new capacity) or fill (full)")
	rateFlag := fs.String("rate", "", "the policy counting calls: `N/PERIOD` (200/1s, 1000/1m), with --burst")
	burst := fs.String("burst", "", "`B`, the most calls that may start at once (the capacity), with --rate")
	var specs []string
	fs.Func("policy", "a policy (repeatable), a `SPEC` unit=U,capacity=C,refill_amount=A,refill_frequency=D (A tokens every D, at most C) or unit=U,rate=N/PERIOD,burst=B, or a window unit=U,rolling=N/PERIOD (at most N in any PERIOD) or unit=U,fixed=N/PERIOD (N per PERIOD of the clock); unit \"\" or calls counts calls", func(s string) error {
		specs = append(specs, s)
		return nil
	})
	pos, ok, err := parse(fs, args, stdout)
	if !ok {
		return err
	}
	name, err := oneName(fs, pos)
	if err != nil {
		return err
	}
	rule, ok := carryRules[*carry]
	if !ok {
		return usagef("set-policies: --carry %q, want proportional, as-is or fill", *carry)
	}
	var ps []bucket.Policy
	switch {
	case *rateFlag != "" && *burst == "":
		return usagef("set-policies: --rate %s needs --burst (the most calls that may start at once)", *rateFlag)
	case *rateFlag == "" && *burst != "":
		return usagef("set-policies: --burst %s needs --rate", *burst)
	case *rateFlag != "":
		p, err := ratePolicy(*rateFlag, *burst)
		if err != nil {
			return usagef("set-policies: --rate %s --burst %s: %v", *rateFlag, *burst, err)
		}
		ps = append(ps, p)
	}
	for _, s := range specs {
		p, err := parsePolicy(s)
		if err != nil {
			return usagef("set-policies: --policy %q: %v", s, err)
		}
		ps = append(ps, p)
	}
	if len(ps) == 0 {
		return usagef("set-policies: no policy given: --rate N/PERIOD --burst B, or --policy unit=U,capacity=C,refill_amount=A,refill_frequency=D (see 'sluice set-policies --help')")
	}

	// The handle's own policies are the new ones: were none stored, SetPolicies
	// stores these, never a placeholder.
	rdb, b, err := t.open(name, ps)
	if err != nil {
		return err
	}
	defer rdb.Close()
	defer b.Close()
	before, err := t.inspect(ctx, b, name)
	if err != nil {
		return err
	}
	sctx, cancel := context.WithTimeout(ctx, opTimeout)
	err = b.SetPolicies(sctx, rule, ps...)
	cancel()
	if err != nil {
		return t.failed("changing the policies of", name, err)
	}
	after, err := t.inspect(ctx, b, name)
	if err != nil {
		return err
	}
	var s strings.Builder
	fmt.Fprintf(&s, "bucket %q: policies changed for every process (tokens carried over: %s)\n", name, *carry)
	if !before.Stored {
		fmt.Fprintf(&s, "before: none stored\n")
	} else {
		fmt.Fprintf(&s, "before:\n")
		for _, p := range before.Policies {
			fmt.Fprintf(&s, "  %s\n", summary(p))
		}
	}
	fmt.Fprintf(&s, "now:\n")
	for _, p := range after.Policies {
		fmt.Fprintf(&s, "  %s\n", summary(p))
	}
	if after.Queued > 0 {
		fmt.Fprintf(&s, "%s re-timed under the new policies\n", plural(after.Queued, "queued caller", "queued callers"))
	}
	_, err = io.WriteString(stdout, s.String())
	return err
}
