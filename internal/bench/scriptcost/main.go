// Command scriptcost measures what a call costs Redis: it makes each call
// named n times against one server and prints the mean INFO commandstats
// usec per call of the script rows (evalsha, eval, fcall). The calls are
// the bucket's own, through package queue, so they are the scripts the
// product runs:
//
//	return1   EVAL "return 1": the least a script costs
//	gcra      cmd/bench's one-script GCRA limiter, one grant
//	granted   enqueue, one caller granted at once (a bucket far from its limit)
//	queued    enqueue, one caller queued (a bucket whose only token is spent)
//	batch     enqueue, -batch callers granted at once in one call
//
// An argument that names a file is run as a script of its own
// (EVALSHA, no KEYS or ARGV). Run it from the repository's root.
//
// Timings on a shared machine are noisy; callgrind.sh runs it against a
// redis-server under valgrind, which counts instructions: repeatable.
//
//	bash internal/bench/scriptcost/callgrind.sh return1 gcra granted queued
//
// It is a measuring tool for this repository, not part of the product.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/queue"
)

func main() {
	addr := flag.String("addr", "", "host:port of the redis-server")
	pace := flag.Duration("pace", 0, "pause between calls (0: back to back)")
	n := flag.Int("n", 2000, "calls per case")
	batch := flag.Int("batch", 100, "callers per call of the batch case")
	flag.Parse()
	if err := run(*addr, *n, *pace, *batch, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "scriptcost:", err)
		os.Exit(1)
	}
}

func run(addr string, n int, pace time.Duration, batch int, cases []string) error {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	for _, name := range cases {
		call, err := prepare(ctx, rdb, name, batch)
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		if err := call(-1); err != nil { // loads the script
			return fmt.Errorf("%s: %w", name, err)
		}
		if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
			return err
		}
		for i := range n {
			if pace > 0 {
				time.Sleep(pace)
			}
			if err := call(i); err != nil {
				return fmt.Errorf("%s call %d: %w", name, i, err)
			}
		}
		usec, err := scriptUsec(ctx, rdb)
		if err != nil {
			return err
		}
		fmt.Printf("%-12s %8.2f µs/call\n", name, usec)
	}
	return nil
}

// prepare returns case name's call number i.
func prepare(ctx context.Context, rdb *redis.Client, name string, batch int) (func(i int) error, error) {
	tag := strconv.Itoa(os.Getpid())
	newQueue := func(p protocol.Policy) *queue.Queue {
		return queue.New(scriptsOnly{rdb}, queueio.Options{Keys: queueio.NewKeys("scriptcost", name+tag),
			Policies: []protocol.Policy{p}, Lookahead: 20 * time.Millisecond, LockTTL: time.Minute, Grace: 10 * time.Second, MaxLateness: time.Hour})
	}
	free := protocol.Policy{Capacity: 1 << 40, RefillAmount: 1 << 30, RefillFrequency: time.Millisecond}
	enqueue := func(q *queue.Queue, m int) func(i int) error {
		return func(i int) error {
			ids := make([]string, m)
			for k := range ids {
				ids[k] = fmt.Sprintf("c%d.%d", i, k)
			}
			_, err := q.Enqueue(ctx, ids, nil, nil)
			return err
		}
	}
	switch name {
	case "return1":
		return func(int) error { return rdb.Eval(ctx, "return 1", nil).Err() }, nil
	case "gcra":
		src, err := os.ReadFile("cmd/bench/gcra.lua")
		if err != nil {
			return nil, err
		}
		s := redis.NewScript(string(src))
		return func(int) error { return s.Run(ctx, rdb, []string{"scriptcost-gcra:{" + tag + "}"}, 1, 1<<30).Err() }, nil
	case "granted":
		return enqueue(newQueue(free), 1), nil
	case "batch":
		return enqueue(newQueue(free), batch), nil
	case "queued":
		q := newQueue(protocol.Policy{Capacity: 1, RefillAmount: 1, RefillFrequency: time.Hour})
		return enqueue(q, 1), nil
	}
	src, err := os.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("neither a case nor a file: %w", err)
	}
	s := redis.NewScript(string(src))
	return func(int) error {
		if err := s.Run(ctx, rdb, nil).Err(); err != nil && err != redis.Nil {
			return err
		}
		return nil
	}, nil
}

// scriptUsec is the usec per call of the script rows of INFO commandstats.
func scriptUsec(ctx context.Context, rdb *redis.Client) (float64, error) {
	info, err := rdb.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0, err
	}
	var usec, calls float64
	for _, l := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(l), ":")
		if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_eval" && name != "cmdstat_fcall") {
			continue
		}
		for _, field := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(field, "=")
			x, _ := strconv.ParseFloat(v, 64)
			switch k {
			case "usec":
				usec += x
			case "calls":
				calls += x
			}
		}
	}
	return usec / max(calls, 1), nil
}

// scriptsOnly hides the *redis.Client from package queue: every arrival
// then runs the enqueue script (no push lane).
type scriptsOnly struct{ queueio.Client }
