package main

import (
	"context"
	"flag"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/scheduler"
)

// The scripts scenario: what each of the bucket's calls costs Redis, by
// INFO commandstats, sent alone. Once back to back ("tight": the server's
// caches stay warm) and once spread out, one call per scriptsPace ("paced":
// as a bucket's calls come in a saturated run, each finding the server
// cold). Beside them, the least a script can cost (EVAL "return 1"), so
// that the rows read as multiples of it on any machine.

const (
	scriptsTight = 2000
	scriptsPaced = 300
	scriptsPace  = 2 * time.Millisecond
)

// Scripts is the scenario's result.
type Scripts struct {
	Tight int           `json:"tight_calls"`
	Paced int           `json:"paced_calls"`
	Pace  time.Duration `json:"pace_ns"`
	Rows  []ScriptCost  `json:"rows"`
	// Enters are whole Enters, saturated: one policy with cost 1 (with
	// the push lane, then without), then three policies with a cost, at
	// the same grant rate; each the median of enterRounds runs.
	Enters []EnterCost `json:"enters"`
	// EnterRatio is a three-policy Enter's Redis time per grant in units
	// of a one-policy one's (the default, with the push lane): the median
	// of the rounds' ratios.
	EnterRatio float64 `json:"enter_ratio"`
}

// EnterCost is what Redis spent per granted Enter of one kind, every
// command of every step included (RedisCPU.CommandsUsec per grant).
type EnterCost struct {
	Name         string  `json:"name"`
	Grants       int     `json:"grants"`
	PerGrantUsec float64 `json:"per_grant_usec"`
}

// enterCostGoal bounds a three-policy Enter with a cost against a
// one-policy one, in Redis time per grant.
const enterCostGoal = 1.3

// ScriptCost is one kind of call: its commandstats time per call, tight
// and paced, in µs.
type ScriptCost struct {
	Name  string   `json:"name"`
	Runs  string   `json:"runs"` // the commands it runs
	Rows  []string `json:"rows"` // the commandstats rows summed
	Tight float64  `json:"tight_usec"`
	Paced float64  `json:"paced_usec"`
}

// costCase is one kind of call: setup once, then for each i prep(i) (not
// counted: it sends only commands outside rows) and call(i); rows are the
// commandstats rows whose usec the calls cost.
type costCase struct {
	name, runs string
	rows       []string
	perCall    bool // divide by the rows' calls, not by the loop's count
	setup      func(ctx context.Context) error
	prep       func(ctx context.Context, i int) error
	call       func(ctx context.Context, i int) error
}

func (*Scripts) about() about {
	return about{name: "scripts", takes: "~20 s", all: true,
		what:  "what each of the bucket's calls costs Redis (INFO commandstats), next to the least a script costs",
		needs: "it reads what each call costs Redis from the server's own accounting (INFO commandstats), which miniredis does not keep"}
}

func (*Scripts) flags(*flag.FlagSet) {}
func (*Scripts) check() error        { return nil }

func (out *Scripts) run(ctx context.Context, e *env) error {
	e.logf("scripts: Redis time of each call, back to back and paced...")
	*out = Scripts{Tight: scriptsTight, Paced: scriptsPaced, Pace: scriptsPace}
	name := e.name
	rdb := client(e.opt, 1)
	defer rdb.Close()
	newQueue := func(suffix string, ps ...protocol.Policy) *queue.Queue {
		var c queueio.Client = rdb
		if strings.HasSuffix(suffix, "-full") {
			// Only the script: on a *redis.Client, callers arriving behind
			// waiting ones would take the push lane.
			c = scriptsOnly{rdb}
		}
		return queue.New(c, queueio.Options{Keys: queueio.NewKeys("sluice", name+suffix),
			Policies: ps, Lookahead: 20 * time.Millisecond, LockTTL: time.Minute, Grace: 10 * time.Second, MaxLateness: time.Hour})
	}
	free := newQueue("-free", protocol.Policy{Capacity: 1 << 40, RefillAmount: 1 << 30, RefillFrequency: time.Millisecond})
	full := newQueue("-full", protocol.Policy{Capacity: 1, RefillAmount: 1, RefillFrequency: time.Hour})
	// Three policies, a request and two of processing units, and a cost
	// of 1 request and 60 PU: Sentinel Hub's shape (bucket.Config.Policies).
	pu := func(capacity int64) protocol.Policy {
		return protocol.Policy{Capacity: capacity, RefillAmount: 1 << 30, RefillFrequency: time.Millisecond, Unit: "pu"}
	}
	free3 := newQueue("-free3", protocol.Policy{Capacity: 1 << 40, RefillAmount: 1 << 30, RefillFrequency: time.Millisecond}, pu(1<<40), pu(1<<40))
	full3 := newQueue("-full3", protocol.Policy{Capacity: 1, RefillAmount: 1, RefillFrequency: time.Hour}, pu(1000), pu(400000))
	cost := [][]int64{{1, 60, 60}}
	// A step finds perStep callers due: 10 tokens a millisecond, and a
	// tight loop's debt is bounded by the lookahead.
	busy := newQueue("-busy", protocol.Policy{Capacity: 1, RefillAmount: 1, RefillFrequency: 100 * time.Microsecond})
	busyKeys, freeKeys := busy.Options().Keys, free.Options().Keys
	sched := scheduler.New(rdb, busy, nil)
	defer sched.Close()
	const perStep = 10
	enqueue := func(ctx context.Context, q *queue.Queue, id string, costs ...[]int64) (queueio.Arrival, error) {
		rs, err := q.Enqueue(ctx, []string{id}, costs, nil)
		if err != nil {
			return queueio.Arrival{}, err
		}
		return rs[0], nil
	}
	cases := []costCase{
		{name: "one-line script", runs: `EVAL "return 1"`, rows: []string{"eval"},
			call: func(ctx context.Context, i int) error { return rdb.Eval(ctx, floorScript, nil).Err() }},
		{name: "gcra script, one grant", runs: "TIME GET SET: the compare scenario's one-script limiter, the least a grant costs", rows: []string{"evalsha"},
			setup: func(ctx context.Context) error { return gcraScript.Load(ctx, rdb).Err() },
			call: func(ctx context.Context, i int) error {
				return gcraScript.Run(ctx, rdb, []string{"bench-gcra:{" + name + "-scripts}"}, 1, 1<<30).Err()
			}},
		{name: "enqueue, granted at once", runs: "TIME GET LLEN SET", rows: []string{"evalsha"},
			setup: func(ctx context.Context) error { _, err := enqueue(ctx, free, "warm"); return err },
			call: func(ctx context.Context, i int) error {
				_, err := enqueue(ctx, free, "g"+strconv.Itoa(i))
				return err
			}},
		{name: "enqueue, queued", runs: "TIME GET LLEN RPUSH", rows: []string{"evalsha"},
			setup: func(ctx context.Context) error {
				_, err := enqueue(ctx, full, "first") // takes the only token: the rest queue
				return err
			},
			call: func(ctx context.Context, i int) error {
				r, err := enqueue(ctx, full, "q"+strconv.Itoa(i))
				if err == nil && r.Entry == "" {
					err = fmt.Errorf("enqueue %d: %+v, want queued", i, r)
				}
				return err
			}},
		{name: "enqueue, 3 policies, cost, granted", runs: "TIME GET LLEN SET", rows: []string{"evalsha"},
			setup: func(ctx context.Context) error { _, err := enqueue(ctx, free3, "warm", cost...); return err },
			call: func(ctx context.Context, i int) error {
				_, err := enqueue(ctx, free3, "g"+strconv.Itoa(i), cost...)
				return err
			}},
		{name: "enqueue, 3 policies, cost, queued", runs: "TIME GET LLEN RPUSH SET", rows: []string{"evalsha"},
			setup: func(ctx context.Context) error {
				_, err := enqueue(ctx, full3, "first", cost...)
				return err
			},
			call: func(ctx context.Context, i int) error {
				r, err := enqueue(ctx, full3, "q"+strconv.Itoa(i), cost...)
				if err == nil && r.Entry == "" {
					err = fmt.Errorf("enqueue %d: %+v, want queued", i, r)
				}
				return err
			}},
		{name: fmt.Sprintf("step, up to %d callers due", perStep), runs: "GET TIME GET LPOP n, n×SET, SET LLEN PEXPIRE PEXPIRE", rows: []string{"evalsha"}, perCall: true,
			prep: func(ctx context.Context, i int) error {
				entries := make([]any, perStep)
				for k := range entries {
					entries[k] = fmt.Sprintf("s%d-%d|0", i, k)
				}
				return rdb.RPush(ctx, busyKeys.Queue, entries...).Err()
			},
			// The scheduler takes the lock and steps until the queue is
			// empty (the last step releases the lock): the row is per step.
			call: func(ctx context.Context, i int) error {
				sched.Ensure()
				for {
					n, err := rdb.Exists(ctx, busyKeys.Queue, busyKeys.Lock).Result()
					if err != nil || n == 0 {
						return err
					}
					select {
					case <-ctx.Done():
						return ctx.Err()
					case <-time.After(100 * time.Microsecond):
					}
				}
			}},
		{name: "poll, slot found", runs: "TIME + GETDEL, pipelined", rows: []string{"time", "getdel"},
			prep: func(ctx context.Context, i int) error {
				return rdb.Set(ctx, freeKeys.Slot+"p"+strconv.Itoa(i), 1, time.Minute).Err()
			},
			call: func(ctx context.Context, i int) error {
				r, err := free.Poll(ctx, "p"+strconv.Itoa(i)+"|0", false)
				if err == nil && (!r.Stale || r.RoundTrips != 1) {
					err = fmt.Errorf("direct poll: %+v, want the (stale) slot in one round trip", r)
				}
				return err
			}},
	}
	for _, c := range cases {
		if c.setup != nil {
			if err := c.setup(ctx); err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
		}
		row := ScriptCost{Name: c.name, Runs: c.runs, Rows: c.rows}
		var err error
		if row.Tight, err = measureCase(ctx, rdb, c, 0, scriptsTight, 0); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		if row.Paced, err = measureCase(ctx, rdb, c, scriptsTight, scriptsPaced, scriptsPace); err != nil {
			return fmt.Errorf("%s: %w", c.name, err)
		}
		out.Rows = append(out.Rows, row)
	}
	// Whole Enters, saturated at 2,000 grants/s: the calls counting
	// policy binds; the PU policies have room to spare (as in most
	// requests against a contract like Sentinel Hub's). Redis time per
	// grant varies by a third from one short run to the next on a shared
	// machine, so the kinds take turns, enterRounds times, and each
	// figure is the median of its rounds; the ratio is the median of the
	// rounds' ratios.
	every := 500 * time.Microsecond
	kinds := []struct {
		name string
		cfg  bucket.Config
		cost bucket.Cost
	}{
		{"Enter, saturated, 1 policy, cost 1", bucket.Config{Capacity: 1, RefillAmount: 1, RefillFrequency: every}, nil},
		{"Enter, saturated, 1 policy, cost 1, with MaxWait (every arrival by script)", bucket.Config{Capacity: 1, RefillAmount: 1, RefillFrequency: every, MaxWait: time.Hour}, nil},
		{"Enter, saturated, 3 policies, cost 1 + 60 PU", bucket.Config{Capacity: 1, RefillAmount: 1, RefillFrequency: every, Policies: []bucket.Policy{
			{Unit: "pu", Capacity: 60000, RefillAmount: 120, RefillFrequency: every},
			{Unit: "pu", Capacity: 1 << 30, RefillAmount: 1 << 20, RefillFrequency: every},
		}}, bucket.Cost{"": 1, "pu": 60}},
	}
	perGrant := make([][]float64, len(kinds))
	grants := make([]int, len(kinds))
	var ratios []float64
	for round := range enterRounds {
		for i, k := range kinds {
			k.cfg.Name = fmt.Sprintf("%s-enter-%d-%d", name, i, round)
			c, err := saturatedEnters(ctx, e, k.cfg, k.cost)
			if err != nil {
				return fmt.Errorf("%s: %w", k.name, err)
			}
			perGrant[i] = append(perGrant[i], c.PerGrantUsec)
			grants[i] += c.Grants
		}
		ratios = append(ratios, perGrant[len(kinds)-1][round]/perGrant[0][round])
	}
	for i, k := range kinds {
		out.Enters = append(out.Enters, EnterCost{Name: k.name, Grants: grants[i], PerGrantUsec: median(perGrant[i])})
	}
	out.EnterRatio = median(ratios)
	return nil
}

// enterRounds is how many times each kind of whole Enter is measured.
const enterRounds = 5

// median of xs, which it sorts.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	slices.Sort(xs)
	return xs[len(xs)/2]
}

// saturatedEnters runs callers looping Enter (with cost, if any) on a
// bucket of cfg for a while, and returns Redis's time per grant.
func saturatedEnters(ctx context.Context, e *env, cfg bucket.Config, cost bucket.Cost) (EnterCost, error) {
	const callers, length = 32, time.Second
	rdb := client(e.opt, callers)
	defer rdb.Close()
	b, err := bucket.New(rdb, cfg)
	if err != nil {
		return EnterCost{}, err
	}
	defer b.Close()
	before, err := readCPU(ctx, rdb)
	if err != nil {
		return EnterCost{}, err
	}
	rctx, cancel := context.WithTimeout(ctx, length)
	defer cancel()
	var grants atomic.Int64
	var wg sync.WaitGroup
	for range callers {
		wg.Go(func() {
			for rctx.Err() == nil {
				var err error
				if cost != nil {
					err = b.EnterCost(rctx, cost)
				} else {
					err = b.Enter(rctx)
				}
				if err == nil {
					grants.Add(1)
				}
			}
		})
	}
	wg.Wait()
	b.Close() // its last steps and cancels count too
	after, err := readCPU(ctx, rdb)
	if err != nil {
		return EnterCost{}, err
	}
	n := int(grants.Load())
	r := redisCPU(before, after, n, e.url != "")
	return EnterCost{Grants: n, PerGrantUsec: float64(r.CommandsUsec) / float64(max(n, 1))}, nil
}

func (sc *Scripts) table(t *table, _ Limit) {
	t.title("SCRIPTS: Redis time per call (INFO commandstats), %s back to back, then %s one every %v", commas(sc.Tight), commas(sc.Paced), sc.Pace)
	t.row("", "tight", "paced", "")
	for _, c := range sc.Rows {
		note := c.Runs
		if floor := sc.Rows[0]; c.Name != floor.Name && floor.Tight > 0 && floor.Paced > 0 {
			note = fmt.Sprintf("%.1f× / %.1f× the one-line script; %s", c.Tight/floor.Tight, c.Paced/floor.Paced, c.Runs)
		}
		t.row(c.Name, usec(c.Tight), usec(c.Paced), note)
	}
	if g, e := sc.row("gcra script, one grant"), sc.row("enqueue, granted at once"); g.Tight > 0 && e.Tight > 0 {
		t.row("a grant at once against the gcra script's", fmt.Sprintf("%.2f×", e.Tight/g.Tight), fmt.Sprintf("%.2f×", e.Paced/g.Paced),
			t.goal(e.Tight <= g.Tight, "≤ 1×, tight"))
	}
	for _, c := range sc.Enters {
		t.row(c.Name, usec(c.PerGrantUsec), "", fmt.Sprintf("per grant, every command included: median of %d rounds (%s grants)", enterRounds, commas(c.Grants)))
	}
	if r := sc.EnterRatio; r > 0 {
		t.row("3 policies with a cost against 1", fmt.Sprintf("%.2f×", r), "", t.goal(r <= enterCostGoal, fmt.Sprintf("≤ %.1f×", enterCostGoal)))
	}
}

// row is the row named name (zero when there is none).
func (sc *Scripts) row(name string) ScriptCost {
	for _, c := range sc.Rows {
		if c.Name == name {
			return c
		}
	}
	return ScriptCost{}
}

func (sc *Scripts) gobench(g *gobench) {
	for _, c := range sc.Rows {
		g.line("Scripts/"+strings.NewReplacer(" ", "-", ",", "").Replace(c.Name), sc.Tight, f(c.Tight), "redis-us/op", f(c.Paced), "paced-redis-us/op")
	}
}

// measureCase runs n calls of c, numbered from first (so that the two
// loops of a case use different IDs), pace apart, and returns the mean
// usec per call of c's rows, from INFO before and after the loop.
func measureCase(ctx context.Context, rdb *redis.Client, c costCase, first, n int, pace time.Duration) (float64, error) {
	before, err := readCPU(ctx, rdb)
	if err != nil {
		return 0, err
	}
	var t *time.Ticker
	if pace > 0 {
		t = time.NewTicker(pace)
		defer t.Stop()
	}
	for i := range n {
		if t != nil {
			select {
			case <-ctx.Done():
				return 0, ctx.Err()
			case <-t.C:
			}
		}
		if c.prep != nil {
			if err := c.prep(ctx, first+i); err != nil {
				return 0, err
			}
		}
		if err := c.call(ctx, first+i); err != nil {
			return 0, err
		}
	}
	after, err := readCPU(ctx, rdb)
	if err != nil {
		return 0, err
	}
	var total, calls int64
	for _, r := range c.rows {
		total += after.rows[r].Usec - before.rows[r].Usec
		calls += after.rows[r].Calls - before.rows[r].Calls
	}
	if c.perCall {
		return float64(total) / float64(max(calls, 1)), nil
	}
	return float64(total) / float64(n), nil
}

// scriptsOnly hides a *redis.Client behind the queueio.Client interface.
type scriptsOnly struct{ queueio.Client }
