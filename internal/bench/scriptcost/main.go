// Command scriptcost measures what a Lua script costs Redis per call: it
// loads each script given (EVALSHA; a file starting with "#!lua" is loaded
// as a function library and called with FCALL "enq"), calls it n times
// against one server, and prints the mean INFO commandstats usec per call.
// A file starting with "--lib", or under queue/lua/, gets
// queue/lua/lib.lua prepended, as the bucket's scripts do; in a function
// library, the lines "--@LIB@" and "--@ENQUEUE@" are replaced by lib.lua
// and enqueue.lua. Run it from the repository's root. Every call passes the bucket's enqueue arguments:
// a bucket far from its limit with -free, else one whose only token is
// spent, so that callers queue.
//
// Timings on a shared machine are noisy; callgrind.sh runs it against a
// redis-server under valgrind, which counts instructions: repeatable. The
// figures of docs/benchmarks.md ("Where a script's time goes") come from
//
//	bash internal/bench/scriptcost/callgrind.sh internal/bench/scriptcost/testdata/*.lua queue/lua/enqueue.lua
//	FREE= bash internal/bench/scriptcost/callgrind.sh queue/lua/enqueue.lua   # the queued path
//
// It is a measuring tool for this repository, not part of the product.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

func main() {
	addr := flag.String("addr", "", "host:port of the redis-server")
	pace := flag.Duration("pace", 0, "pause between calls (0: back to back)")
	n := flag.Int("n", 2000, "calls per script")
	free := flag.Bool("free", false, "a bucket far from its limit: enqueue grants at once")
	lib := flag.String("lib", "queue/lua/lib.lua", "the library prepended to --lib scripts")
	batch := flag.Int("batch", 1, "callers per call (enqueue's m)")
	flag.Parse()
	if err := run(*addr, *lib, *n, *pace, *free, *batch, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "scriptcost:", err)
		os.Exit(1)
	}
}

func run(addr, libPath string, n int, pace time.Duration, free bool, batch int, files []string) error {
	ctx := context.Background()
	rdb := redis.NewClient(&redis.Options{Addr: addr})
	defer rdb.Close()
	lib, err := os.ReadFile(libPath)
	if err != nil {
		return err
	}
	keys := []string{"scriptcost:{b}:queue", "scriptcost:{b}:state"}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		src := string(b)
		if strings.HasPrefix(src, "--lib") || strings.HasPrefix(f, "queue/lua/") {
			src = string(lib) + src
		}
		if strings.HasPrefix(src, "#!lua") {
			enq, err := os.ReadFile("queue/lua/enqueue.lua")
			if err != nil {
				return err
			}
			src = strings.Replace(src, "--@LIB@", string(lib), 1)
			src = strings.Replace(src, "--@ENQUEUE@", string(enq), 1)
		}
		fn := strings.HasPrefix(src, "#!lua")
		s := redis.NewScript(src)
		if fn {
			err = rdb.FunctionLoadReplace(ctx, src).Err()
		} else {
			err = s.Load(ctx, rdb).Err()
		}
		if err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		if err := rdb.Del(ctx, keys...).Err(); err != nil {
			return err
		}
		if err := rdb.ConfigResetStat(ctx).Err(); err != nil {
			return err
		}
		for i := range n {
			if pace > 0 {
				time.Sleep(pace)
			}
			args := enqueueArgs(free, i, batch)
			if fn {
				err = rdb.FCall(ctx, "enq", keys, args...).Err()
			} else {
				err = s.EvalSha(ctx, rdb, keys, args...).Err()
			}
			if err != nil && err != redis.Nil {
				return fmt.Errorf("%s call %d: %w", f, i, err)
			}
		}
		info, err := rdb.Info(ctx, "commandstats").Result()
		if err != nil {
			return err
		}
		for _, l := range strings.Split(info, "\n") {
			name, rest, ok := strings.Cut(strings.TrimSpace(l), ":")
			if !ok || (name != "cmdstat_evalsha" && name != "cmdstat_fcall") {
				continue
			}
			for _, field := range strings.Split(rest, ",") {
				if v, ok := strings.CutPrefix(field, "usec_per_call="); ok {
					fmt.Printf("%-40s %s µs/call\n", f, v)
				}
			}
		}
	}
	return nil
}

// enqueueArgs are enqueue.lua's ARGV for call i: lookahead 20 ms, no
// MaxQueue or MaxWait, grace 1 s, one policy, batch callers.
func enqueueArgs(free bool, i, batch int) []any {
	args := []any{20000, 0, 0, 1000000, 1, 1, 1, 1000000000, batch}
	if free {
		args = []any{20000, 0, 0, 1000000, 1, int64(1) << 40, int64(1) << 30, 1000, batch}
	}
	for k := range batch {
		args = append(args, fmt.Sprintf("id%d.%d", i, k), "", 0) // no costs or wait of its own
	}
	return args
}
