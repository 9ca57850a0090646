package main

import (
	"context"
	_ "embed"
	"fmt"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice/bucket"
)

// The limiters the compare scenario puts side by side, each used as its
// users use it: call, and return when the caller may start.

// limiter is one limiter instance shared by the callers of one workload.
type limiter interface {
	Wait(ctx context.Context) error
	Close() error
}

// rateLimit is a limit every contender can express: Burst at once, then
// Amount every Every.
type rateLimit struct {
	Burst  int
	Amount int
	Every  time.Duration
}

// farAbove is a limit no workload here reaches.
var farAbove = rateLimit{Burst: 1e9, Amount: 1e9, Every: time.Second}

// contender makes limiters of one kind.
type contender struct {
	Name string
	Key  string // Name as one word, for --gobench
	// Redis is false for an in-process limiter (its round trips are 0).
	Redis bool
	// New returns a limiter named name (fresh keys) on rdb.
	New func(rdb *redis.Client, name string, l rateLimit) (limiter, error)
}

var contenders = []contender{
	{Name: "sluice", Key: "sluice", Redis: true, New: newSluice},
	{Name: "x/time/rate", Key: "xrate", New: newXRate},
	{Name: "gcra script", Key: "gcra", Redis: true, New: newGCRA},
	{Name: "redis_rate", Key: "redis_rate", Redis: true, New: newRedisRate},
}

// sluice: bucket.Enter.
type sluiceLimiter struct{ *bucket.Bucket }

func (s sluiceLimiter) Wait(ctx context.Context) error { return s.Enter(ctx) }

func newSluice(rdb *redis.Client, name string, l rateLimit) (limiter, error) {
	b, err := bucket.New(rdb, bucket.Config{Name: name, Capacity: l.Burst, RefillAmount: l.Amount, RefillFrequency: l.Every})
	if err != nil {
		return nil, err
	}
	return sluiceLimiter{b}, nil
}

// x/time/rate: Limiter.Wait, in this process only (the floor).
type xrateLimiter struct{ *rate.Limiter }

func (xrateLimiter) Close() error { return nil }

func newXRate(_ *redis.Client, _ string, l rateLimit) (limiter, error) {
	r := rate.Limit(float64(l.Amount) / l.Every.Seconds())
	return xrateLimiter{rate.NewLimiter(r, l.Burst)}, nil
}

// gcra script: one script call books the caller's slot (gcra.lua), then
// the caller sleeps until it. A caller that gives up while sleeping wastes
// its slot: the script has no way back.
//
//go:embed gcra.lua
var gcraLua string

var gcraScript = redis.NewScript(gcraLua)

type gcraLimiter struct {
	rdb      *redis.Client
	key      string
	interval int64 // µs
	burst    int
}

func newGCRA(rdb *redis.Client, name string, l rateLimit) (limiter, error) {
	// The script counts whole µs; a limit beyond a token per µs is
	// clamped to one (still far above what any workload here reaches).
	interval := max(1, l.Every.Microseconds()/int64(l.Amount))
	g := &gcraLimiter{rdb: rdb, key: "bench-gcra:{" + name + "}", interval: interval, burst: l.Burst}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return g, gcraScript.Load(ctx, rdb).Err()
}

func (g *gcraLimiter) Wait(ctx context.Context) error {
	res, err := gcraScript.Run(ctx, g.rdb, []string{g.key}, g.interval, g.burst).Int64Slice()
	received := time.Now()
	if err != nil {
		return err
	}
	if len(res) != 2 || res[0] < 0 {
		return fmt.Errorf("gcra: unexpected reply %v", res)
	}
	return sleepUntil(ctx, received.Add(time.Duration(res[0])*time.Microsecond))
}

func (g *gcraLimiter) Close() error { return nil }

// redis_rate: Allow; when refused, sleep RetryAfter and try again, as the
// library's users do (it has no waiting call).
type redisRateLimiter struct {
	l     *redis_rate.Limiter
	key   string
	limit redis_rate.Limit
}

func newRedisRate(rdb *redis.Client, name string, l rateLimit) (limiter, error) {
	return &redisRateLimiter{
		l:     redis_rate.NewLimiter(rdb),
		key:   name,
		limit: redis_rate.Limit{Rate: l.Amount, Burst: l.Burst, Period: l.Every},
	}, nil
}

func (r *redisRateLimiter) Wait(ctx context.Context) error {
	for {
		res, err := r.l.Allow(ctx, r.key, r.limit)
		if err != nil {
			return err
		}
		if res.Allowed > 0 {
			return nil
		}
		if err := sleepUntil(ctx, time.Now().Add(res.RetryAfter)); err != nil {
			return err
		}
	}
}

func (r *redisRateLimiter) Close() error { return nil }

// sleepUntil returns at t, or with ctx's error if ctx ends first.
func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
