package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/queue"
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
}

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
	setup      func(ctx context.Context) error
	prep       func(ctx context.Context, i int) error
	call       func(ctx context.Context, i int) error
}

func scriptsScenario(ctx context.Context, opt *redis.Options, name string, stderr io.Writer) (Scripts, error) {
	fmt.Fprintln(stderr, "scripts: Redis time of each call, back to back and paced...")
	out := Scripts{Tight: scriptsTight, Paced: scriptsPaced, Pace: scriptsPace}
	rdb := client(opt, 1)
	defer rdb.Close()
	open := queue.Options{Lookahead: 20 * time.Millisecond, LockTTL: time.Minute, Grace: 10 * time.Second, Tolerance: time.Hour}
	free := queue.New(rdb, "sluice", name+"-free", []queue.Policy{{Capacity: 1 << 40, Amount: 1 << 30, Every: time.Millisecond}}, open)
	full := queue.New(rdb, "sluice", name+"-full", []queue.Policy{{Capacity: 1, Amount: 1, Every: time.Hour}}, open)
	// A step finds perStep callers due: 10 tokens a millisecond, and a
	// tight loop's debt is bounded by the lookahead.
	busy := queue.New(rdb, "sluice", name+"-busy", []queue.Policy{{Capacity: 1, Amount: 1, Every: 100 * time.Microsecond}}, open)
	const perStep = 10
	token := "bench-" + name
	cases := []costCase{
		{name: "one-line script", runs: `EVAL "return 1"`, rows: []string{"eval"},
			call: func(ctx context.Context, i int) error { return rdb.Eval(ctx, floorScript, nil).Err() }},
		{name: "enqueue, granted at once", runs: "TIME GET LLEN SET", rows: []string{"evalsha"},
			setup: func(ctx context.Context) error { return free.Load(ctx) },
			call: func(ctx context.Context, i int) error {
				_, err := free.Enqueue(ctx, "g"+strconv.Itoa(i))
				return err
			}},
		{name: "enqueue, queued", runs: "TIME GET LLEN RPUSH", rows: []string{"evalsha"},
			setup: func(ctx context.Context) error {
				if err := full.Load(ctx); err != nil {
					return err
				}
				_, err := full.Enqueue(ctx, "first") // takes the only token: the rest queue
				return err
			},
			call: func(ctx context.Context, i int) error {
				r, err := full.Enqueue(ctx, "q"+strconv.Itoa(i))
				if err == nil && r.Kind != queue.Queued {
					err = fmt.Errorf("enqueue %d: %+v, want queued", i, r)
				}
				return err
			}},
		{name: fmt.Sprintf("step, up to %d callers due", perStep), runs: "GET TIME GET LPOP n, n×SET, SET LLEN PEXPIRE PEXPIRE", rows: []string{"evalsha"},
			setup: func(ctx context.Context) error { return busy.Load(ctx) },
			prep: func(ctx context.Context, i int) error {
				// The lock, as redislock sets it (a step that empties the
				// queue releases it), and perStep callers.
				if err := rdb.Set(ctx, busy.Keys().Lock, token, time.Minute).Err(); err != nil {
					return err
				}
				entries := make([]any, perStep)
				for k := range entries {
					entries[k] = fmt.Sprintf("s%d-%d|0", i, k)
				}
				return rdb.RPush(ctx, busy.Keys().Queue, entries...).Err()
			},
			call: func(ctx context.Context, i int) error {
				r, err := busy.Step(ctx, token)
				if err == nil && r.Status == queue.Fenced {
					err = fmt.Errorf("step fenced")
				}
				return err
			}},
		{name: "poll, slot found", runs: "TIME + GETDEL, pipelined", rows: []string{"time", "getdel"},
			prep: func(ctx context.Context, i int) error {
				return rdb.Set(ctx, free.Keys().SlotKey("p"+strconv.Itoa(i)), 1, time.Minute).Err()
			},
			call: func(ctx context.Context, i int) error {
				r, err := free.Poll(ctx, "p"+strconv.Itoa(i)+"|0")
				if err == nil && (r.Kind != queue.Stale || r.RoundTrips != 1) {
					err = fmt.Errorf("direct poll: %+v, want the (stale) slot in one round trip", r)
				}
				return err
			}},
	}
	for _, c := range cases {
		if c.setup != nil {
			if err := c.setup(ctx); err != nil {
				return out, fmt.Errorf("%s: %w", c.name, err)
			}
		}
		row := ScriptCost{Name: c.name, Runs: c.runs, Rows: c.rows}
		var err error
		if row.Tight, err = measureCase(ctx, rdb, c, 0, scriptsTight, 0); err != nil {
			return out, fmt.Errorf("%s: %w", c.name, err)
		}
		if row.Paced, err = measureCase(ctx, rdb, c, scriptsTight, scriptsPaced, scriptsPace); err != nil {
			return out, fmt.Errorf("%s: %w", c.name, err)
		}
		out.Rows = append(out.Rows, row)
	}
	return out, nil
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
	var total int64
	for _, r := range c.rows {
		total += after.rows[r].Usec - before.rows[r].Usec
	}
	return float64(total) / float64(n), nil
}
