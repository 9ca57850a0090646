package main

import (
	"context"
	"encoding/json"
	"os"
	"os/signal"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/bench/loadgen"
)

// workerTarget is the Redis server of a worker process's spec, embedded
// in the specs of the scenarios whose workers openWorker starts.
type workerTarget struct {
	Addr string `json:"addr"`
	URL  string `json:"url,omitempty"` // --redis, when given: wins over Addr
}

func (t *workerTarget) redisTarget() *workerTarget { return t }

// workers is the Redis server the scenario's worker processes use.
func (e *env) workers() workerTarget { return workerTarget{Addr: e.opt.Addr, URL: e.url} }

// openWorker decodes a worker process's spec from raw, and returns the ctx
// that ends on SIGINT or SIGTERM (stop releases it) and the options of
// the spec's Redis server.
func openWorker[S interface{ redisTarget() *workerTarget }](raw string, spec S) (ctx context.Context, stop context.CancelFunc, opt *redis.Options, err error) {
	if err := json.Unmarshal([]byte(raw), spec); err != nil {
		return nil, nil, nil, err
	}
	t := spec.redisTarget()
	if opt, err = loadgen.RedisOptions(t.Addr, t.URL); err != nil {
		return nil, nil, nil, err
	}
	ctx, stop = signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	return ctx, stop, opt, nil
}
