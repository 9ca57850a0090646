package main

import (
	"cmp"
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/scheduler"
)

// The cost case of the lanes scenario: Lanes.Tenants callers, a lane of
// their own each, then all in one lane. Does the scheduler's step cost
// more with thousands of lanes than with one? The same callers in the
// default lane, with no lanes, are measured for reference (the step
// alone).

// LanesCost is the cost case, a row for each layout: a lane each, one
// lane, no lanes.
type LanesCost struct {
	Skipped string         `json:"skipped,omitempty"` // why it was not measured
	Rows    []LanesCostRow `json:"rows,omitempty"`
}

// LanesCostRow is one layout, measured twice. Step: the callers queued
// at once and only the scheduler running, which serves them for the
// window; its step script's Redis time (INFO commandstats: the only
// script then). Live: the callers loop on Enter in the worker processes;
// the grants a second in the window and what every command cost Redis
// per grant.
type LanesCostRow struct {
	Lanes      int     `json:"lanes"`
	StepGrants int     `json:"step_grants"` // slots the steps gave
	Steps      int64   `json:"steps"`
	StepUsec   int64   `json:"step_usec"`
	StepJudged int     `json:"step_judged"` // those and the callers' given a slot as they came
	StepExcess int     `json:"step_excess"` // of the StepJudged over the limit
	Rate       float64 `json:"live_rate_per_s"`
	LiveUsec   int64   `json:"live_commands_usec"` // every command in the window (RedisCPU.CommandsUsec)
	LiveGrants int     `json:"live_grants"`        // in the window
	LiveTop    string  `json:"live_costliest"`     // the costliest commands (RedisCPU.topString)
	lanesRun
}

// PerGrant is the step's Redis time per grant, µs.
func (r LanesCostRow) PerGrant() float64 { return float64(r.StepUsec) / float64(max(r.StepGrants, 1)) }

// Ratio is the first layout's step time per grant over the second's.
func (c *LanesCost) Ratio() float64 {
	if len(c.Rows) < 2 || c.Rows[1].PerGrant() == 0 {
		return 0
	}
	return c.Rows[0].PerGrant() / c.Rows[1].PerGrant()
}

func (ln *Lanes) runCost(ctx context.Context, e *env) (*LanesCost, error) {
	out := &LanesCost{}
	probe := client(e.opt, 1)
	defer probe.Close()
	if s, err := readCPU(ctx, probe); err != nil || len(s.rows) == 0 {
		out.Skipped = "it reads Redis's own time per command (INFO commandstats), which this server does not report"
		return out, nil
	}
	// The default lane last, for reference: the step without lanes.
	for _, lanes := range []int{ln.Tenants, 1, 0} {
		row := LanesCostRow{Lanes: lanes}
		name := fmt.Sprintf("%s-cost-%d", e.name, lanes)
		if err := ln.stepCost(ctx, probe, name+"-step", &row); err != nil {
			return out, err
		}
		if lanes > 0 {
			if err := ln.liveCost(ctx, e, probe, name+"-live", &row); err != nil {
				return out, err
			}
		}
		out.Rows = append(out.Rows, row)
	}
	return out, nil
}

// costLane is the i-th caller's lane when there are lanes: a lane each
// ("t<i>"), one lane ("one"), or none (the default lane, "").
func costLane(i, lanes int) string {
	switch lanes {
	case 0:
		return ""
	case 1:
		return "one"
	}
	return "t" + strconv.Itoa(i)
}

// stepCost queues ln.Tenants callers on a bucket of the case's limit,
// then lets a scheduler alone serve them for ln.Duration: the Redis time
// of its steps, and the slots they gave, all judged.
func (ln *Lanes) stepCost(ctx context.Context, probe *redis.Client, name string, row *LanesCostRow) error {
	keys := queueio.NewKeys(defaultKeyPrefix, name)
	q := queue.New(probe, queueio.Options{Keys: keys, Lookahead: lanesLookahead, LockTTL: time.Second, Grace: 10 * time.Second,
		MaxLateness: defaultMaxLateness, Lead: lanesLookahead / 4, Policies: []protocol.Policy{{Capacity: int64(lanesLimit.Capacity),
			RefillAmount: int64(lanesLimit.RefillAmount), RefillFrequency: lanesLimit.RefillFrequency}}})
	var slots []time.Time
	var queued []string
	for i := 0; i < ln.Tenants; i += 100 {
		var ids []string
		for k := i; k < min(i+100, ln.Tenants); k++ {
			ids = append(ids, "c"+strconv.Itoa(k)+protocol.LaneID(costLane(k, row.Lanes), 1, 0))
		}
		as, err := q.Enqueue(ctx, ids, nil, nil)
		if err != nil {
			return fmt.Errorf("queueing: %w", err)
		}
		for k, a := range as {
			switch {
			case a.Err != nil:
				return fmt.Errorf("queueing: %w", a.Err)
			case a.Queued():
				queued = append(queued, ids[k])
			default:
				slots = append(slots, time.UnixMicro(a.Slot)) // at once, from the full bucket
			}
		}
	}
	before, err := readCPU(ctx, probe)
	if err != nil {
		return err
	}
	sched := scheduler.New(probe, q, nil)
	sched.Ensure()
	sleepCtx(ctx, ln.Duration)
	sched.Close() // its last step too
	row.Steps, _, _ = sched.Stats()
	after, err := readCPU(ctx, probe)
	if err != nil {
		return err
	}
	row.StepUsec = after.rows["evalsha"].Usec - before.rows["evalsha"].Usec + after.rows["eval"].Usec - before.rows["eval"].Usec
	given, err := slotsOf(ctx, probe, keys, queued)
	slots = append(slots, given...)
	row.StepGrants, row.StepJudged, row.StepExcess = len(given), len(slots), guarantee.Check(slots, lanesLimit).Excess
	return err
}

// slotsOf reads the slots the scheduler wrote for ids (those it gave
// one).
func slotsOf(ctx context.Context, rdb *redis.Client, keys queueio.Keys, ids []string) ([]time.Time, error) {
	var out []time.Time
	for i := 0; i < len(ids); i += 500 {
		var ks []string
		for _, id := range ids[i:min(i+500, len(ids))] {
			ks = append(ks, keys.Slot+id)
		}
		vs, err := rdb.MGet(ctx, ks...).Result()
		if err != nil {
			return nil, err
		}
		for _, v := range vs {
			s, ok := v.(string)
			if !ok {
				continue // not given a slot
			}
			at, _, _ := strings.Cut(s, " ") // "<µs>[ <room>]"
			us, err := strconv.ParseInt(at, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("slot %q: %w", s, err)
			}
			out = append(out, time.UnixMicro(us))
		}
	}
	return out, nil
}

// liveCost has ln.Tenants callers loop on Enter in the worker processes,
// arriving over lanesArrive, and reads what Redis spent over the window
// after a warm-up.
func (ln *Lanes) liveCost(ctx context.Context, e *env, probe *redis.Client, name string, row *LanesCostRow) error {
	procs := make([][]lanesGroup, ln.Procs)
	own, lane := row.Lanes > 1, costLane(0, row.Lanes)
	if own {
		lane = "t"
	}
	for i, first := 0, 0; i < ln.Procs; i++ {
		n := share(ln.Tenants, ln.Procs, i)
		procs[i] = []lanesGroup{{Lane: lane, Own: own, First: first, Callers: n, Spread: lanesArrive}}
		first += n
	}
	start := lanesArrive + lanesWarmup
	var t1, t2 time.Time
	var before, after cpuSample
	var errs [4]error
	measure := func(ctx context.Context, begin time.Time) {
		if sleepUntil(ctx, begin.Add(start)) != nil {
			errs[0] = fmt.Errorf("the workers ended before the window: %w", ctx.Err())
			return
		}
		before, errs[0] = readCPU(ctx, probe)
		t1, errs[1] = probe.Time(ctx).Result()
		if sleepUntil(ctx, begin.Add(start+ln.Duration)) != nil {
			errs[2] = fmt.Errorf("the workers ended within the window: %w", ctx.Err())
			return
		}
		t2, errs[2] = probe.Time(ctx).Result()
		after, errs[3] = readCPU(ctx, probe)
	}
	recs, run, err := runLanes(ctx, e, lanesConfig(name), procs, start+ln.Duration+lanesWarmup, measure)
	row.lanesRun = run
	for _, x := range errs {
		err = cmp.Or(err, x)
	}
	if err != nil {
		return err
	}
	for _, r := range recs {
		if !r.Slot.Before(t1) && r.Slot.Before(t2) {
			row.LiveGrants++
		}
	}
	row.Rate = float64(row.LiveGrants) / t2.Sub(t1).Seconds()
	c := redisCPU(before, after, row.LiveGrants, e.url != "")
	row.LiveUsec, row.LiveTop = c.CommandsUsec, c.topString(4)
	return nil
}

func (c *LanesCost) table(t *table, ln *Lanes) {
	t.row("scheduler's cost", "per grant", fmt.Sprintf("%s callers, a lane of their own each, then all in one lane, then (for reference) in none", commas(ln.Tenants)))
	if c.Skipped != "" {
		t.row("  not measured", "", c.Skipped)
	}
	for _, r := range c.Rows {
		name := fmt.Sprintf("  %s lanes", commas(r.Lanes))
		switch r.Lanes {
		case 0:
			name = "  no lanes (the default lane)"
		case 1:
			name = "  one lane"
		}
		t.row(name+": the step alone", usec(r.PerGrant()), fmt.Sprintf("the step script's Redis time (INFO commandstats): %s steps for %s grants, the callers queued and only the scheduler running for %v",
			commas(int(r.Steps)), commas(r.StepGrants), ln.Duration))
		if r.Lanes > 0 {
			t.row(name+": live", usec(float64(r.LiveUsec)/float64(max(r.LiveGrants, 1))), fmt.Sprintf("every command, per grant (INFO commandstats), the callers looping on Enter in %d processes (arriving over %v): %s grants/s, %.1f %% of the limit; costliest: %s",
				ln.Procs, dur(lanesArrive), num(r.Rate), 100*r.Rate/lanesRate(), r.LiveTop))
		}
		all := r.lanesRun
		all.Grants, all.Excess = all.Grants+r.StepJudged, max(all.Excess, r.StepExcess)
		runRows(t, name+": excess over the limit", all)
	}
	if x := c.Ratio(); x > 0 {
		t.row(fmt.Sprintf("  %s lanes against one, the step", commas(ln.Tenants)), fmt.Sprintf("%.2f×", x), t.goal(x <= lanesCostGoal, fmt.Sprintf("≤ %.1f×", lanesCostGoal)))
	}
}

func (c *LanesCost) gobench(g *gobench) {
	for _, r := range c.Rows {
		g.line(fmt.Sprintf("Lanes/cost/lanes=%d", r.Lanes), r.StepGrants, f(r.PerGrant()), "step-us/grant", f(float64(r.LiveUsec)/float64(max(r.LiveGrants, 1))), "live-us/grant", f(r.Rate), "live-grants/s")
	}
	if x := c.Ratio(); x > 0 {
		g.line("Lanes/cost/ratio", 1, f(x), "lanes/one")
	}
}
