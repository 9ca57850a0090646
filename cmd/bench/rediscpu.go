package main

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// scriptCommands are the commands the bucket's scripts run: those of
// queue/lua/*.lua (TestScriptCommandsCoverLua keeps the list complete) and
// of github.com/bsm/redislock's scripts. Redis 7 counts a command run
// inside a script twice in INFO commandstats: in its own row and inside
// the usec of the EVALSHA or EVAL that ran it (checked: a script running
// 200,000 SETs shows 444 ms under eval and 99 ms under set, with 436 ms
// of CPU in all). EXEC counts the commands of its transaction the same
// way (checked: an EXEC of two ZRANGEs of 18,044 µs took 18,065 µs), and
// the bucket's push lane sends TIME, GET, RPUSH and PEXPIRE only inside
// MULTI/EXEC. Their rows are therefore left out of the sum. The one
// exception is TIME, which a bucket's direct poll also sends, with one
// GETDEL (which no script runs): see directTime. (A direct poll also
// sends a ZREM of the due set: the ZREMs are left out with the scripts',
// so the figure leaves that command of a poll out.)
var scriptCommands = []string{
	"time", "get", "set", "getrange", "del", "exists", "pexpire", "pttl", "publish",
	"llen", "rpush", "lpop", "lpos", "lrem", "lrange", "ltrim", "lset", "lindex",
	"zadd", "zrangebyscore", "zremrangebyscore", "zcard", "zrem",
	"zrange", "zscore", "hget", "hmget", "hset", "hdel",
}

// directTime is the part of the TIME row's usec sent by clients, not by
// scripts: a direct poll is one TIME and one GETDEL, and nothing else
// sends GETDEL, so that many of the TIME calls are direct; they are
// counted at the row's mean cost.
func directTime(timeRow, getdelRow CommandCost) int64 {
	if timeRow.Calls <= 0 || getdelRow.Calls <= 0 {
		return 0
	}
	direct := min(getdelRow.Calls, timeRow.Calls)
	return timeRow.Usec * direct / timeRow.Calls
}

// probeCommands are what this command itself sends to read the figures.
var probeCommands = []string{"info", "config|resetstat"}

// floorScript is the one-line script this command sends at the grant pace
// during a run (see paceFloor), as EVAL so that its row is its own: a
// bucket sends EVALSHA, and EVAL only when a server lost its scripts.
const floorScript = "return 1"

// RedisCPU is what a run cost the Redis server, from INFO before and
// after it.
type RedisCPU struct {
	// Shared is true when the server came from --redis: other clients'
	// commands count too, so the figures are an upper bound.
	Shared bool `json:"shared"`
	// CommandsUsec sums the usec of every INFO commandstats row, less the
	// rows of scriptCommands (already inside their script's usec) and of
	// this command's own INFO calls: the time Redis spent executing what
	// clients sent, scripts included. ScriptsUsec is the EVALSHA and EVAL
	// part of it.
	CommandsUsec int64 `json:"commands_usec"`
	ScriptsUsec  int64 `json:"scripts_usec"`
	// PerGrant is CommandsUsec per grant: the figure of the project's goal.
	PerGrant time.Duration `json:"commands_per_grant_ns"`
	// ProcessCPU is the change of INFO cpu used_cpu_sys + used_cpu_user:
	// every thread of the server, with reading requests, writing replies
	// and the event loop, which commandstats leave out.
	ProcessCPU         time.Duration `json:"process_cpu_ns"`
	ProcessCPUPerGrant time.Duration `json:"process_cpu_per_grant_ns"`
	// Top lists the rows that cost most (script rows first among equals).
	Top []CommandCost `json:"top"`
	// FloorUsec is the mean commandstats time of one EVAL of floorScript,
	// sent by this command at the grant pace during the same run: what the
	// server charges for the least a script can do, on this machine under
	// this load. PerGrantFloors is PerGrant in those units. Both are 0
	// when no floor script ran.
	FloorUsec      float64 `json:"one_line_script_usec"`
	PerGrantFloors float64 `json:"per_grant_in_one_line_scripts"`
}

// CommandCost is one commandstats row's change over the run.
type CommandCost struct {
	Name  string `json:"name"`
	Calls int64  `json:"calls"`
	Usec  int64  `json:"usec"`
	// Inner is true for the rows of commands run by scripts, not summed.
	Inner bool `json:"inner,omitempty"`
}

// redisCPUGoal is the project's goal for CommandsUsec per grant.
const redisCPUGoal = 20 * time.Microsecond

// cpuSample is one reading of INFO commandstats and INFO cpu.
type cpuSample struct {
	rows map[string]CommandCost
	cpu  float64 // seconds, sys + user
}

func readCPU(ctx context.Context, rdb *redis.Client) (cpuSample, error) {
	info, err := rdb.Info(ctx, "commandstats", "cpu").Result()
	if err != nil {
		return cpuSample{}, err
	}
	return parseCPU(info)
}

// parseCPU reads the rows of INFO commandstats
// ("cmdstat_evalsha:calls=5,usec=80,usec_per_call=16.00,...") and
// used_cpu_sys, used_cpu_user of INFO cpu.
func parseCPU(info string) (cpuSample, error) {
	s := cpuSample{rows: map[string]CommandCost{}}
	for line := range strings.SplitSeq(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		if name, ok := strings.CutPrefix(k, "cmdstat_"); ok {
			c := CommandCost{Name: name}
			for field := range strings.SplitSeq(v, ",") {
				fk, fv, _ := strings.Cut(field, "=")
				dst := map[string]*int64{"calls": &c.Calls, "usec": &c.Usec}[fk]
				if dst == nil {
					continue
				}
				n, err := strconv.ParseInt(fv, 10, 64)
				if err != nil {
					return s, fmt.Errorf("INFO commandstats %s: %w", k, err)
				}
				*dst = n
			}
			s.rows[name] = c
		}
	}
	var err error
	s.cpu, err = redistest.ServerCPU(info)
	return s, err
}

// redisCPU is the cost of the run between before and after, spread over
// grants.
func redisCPU(before, after cpuSample, grants int, shared bool) RedisCPU {
	r := RedisCPU{Shared: shared}
	var rows []CommandCost
	delta := func(name string) CommandCost {
		a, b := after.rows[name], before.rows[name]
		return CommandCost{Name: name, Calls: a.Calls - b.Calls, Usec: a.Usec - b.Usec}
	}
	r.CommandsUsec += directTime(delta("time"), delta("getdel"))
	for name := range after.rows {
		d := delta(name)
		if d.Calls <= 0 || slices.Contains(probeCommands, name) {
			continue
		}
		if name == "eval" { // this command's floor script, not the bucket's
			r.FloorUsec = float64(d.Usec) / float64(d.Calls)
			continue
		}
		d.Inner = slices.Contains(scriptCommands, name)
		rows = append(rows, d)
		if d.Inner {
			continue
		}
		r.CommandsUsec += d.Usec
		if name == "evalsha" || name == "eval" {
			r.ScriptsUsec += d.Usec
		}
	}
	slices.SortFunc(rows, func(x, y CommandCost) int {
		return cmp.Or(cmp.Compare(y.Usec, x.Usec), strings.Compare(x.Name, y.Name))
	})
	r.Top = rows[:min(len(rows), 8)]
	r.ProcessCPU = time.Duration((after.cpu - before.cpu) * float64(time.Second))
	if grants > 0 {
		r.PerGrant = time.Duration(r.CommandsUsec) * time.Microsecond / time.Duration(grants)
		r.ProcessCPUPerGrant = r.ProcessCPU / time.Duration(grants)
		if r.FloorUsec > 0 {
			r.PerGrantFloors = float64(r.CommandsUsec) / float64(grants) / r.FloorUsec
		}
	}
	return r
}

// paceFloor sends floorScript every interval until ctx ends, and returns
// how many it sent. Sent one at a time and spread out like the grants,
// each finds the server as cold or warm as the bucket's scripts do.
func paceFloor(ctx context.Context, rdb *redis.Client, interval time.Duration) int {
	t := time.NewTicker(interval)
	defer t.Stop()
	n := 0
	for {
		select {
		case <-ctx.Done():
			return n
		case <-t.C:
			if rdb.Eval(ctx, floorScript, nil).Err() == nil {
				n++
			}
		}
	}
}

// topString lists the costliest rows: "evalsha 12,345 calls 80 ms, ...".
func (r RedisCPU) topString(n int) string {
	var parts []string
	for _, c := range r.Top[:min(n, len(r.Top))] {
		inner := ""
		if c.Inner {
			inner = " (in scripts)"
		}
		parts = append(parts, fmt.Sprintf("%s%s %s calls %s", c.Name, inner, commas(int(c.Calls)), dur(time.Duration(c.Usec)*time.Microsecond)))
	}
	return strings.Join(parts, ", ")
}
