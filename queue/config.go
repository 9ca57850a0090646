package queue

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
	"github.com/sluicehq/sluice/internal/scriptreply"
)

// The configuration in force. A bucket's policies live in Redis (the
// config key, internal/protocol/config.go), and every script that reads
// the state checks that it runs under them (state.lua's load): a script of
// a process whose policies differ changes nothing and fails. When no
// configuration is stored yet, the first process to run a script stores
// its own. A process that learns of another configuration (reading it
// with queueio.ReadConfig) follows it (Follow) or fails, as its owner
// decides (package bucket).

//go:embed lua/change.lua
var changeLua string

var changeScript = protocol.Script(changeLua, protocol.TokensLua, protocol.StateLua, protocol.EntryLua, protocol.WakeLua)

// conf is the configuration a Queue runs under, as the scripts take it.
type conf struct {
	id       string
	policies []protocol.Policy
	args     []any // protocol.PolicyArgs
	pushable bool  // one policy, counting calls: the push lane may serve
}

func newConf(ps []protocol.Policy) *conf {
	return &conf{
		id:       protocol.ConfigID(ps),
		policies: slices.Clone(ps),
		args:     protocol.PolicyArgs(ps),
		pushable: len(ps) == 1 && ps[0].Unit == "",
	}
}

// configReply reads a script's refusal for its configuration (state.lua's
// config_check): "SLUICE_CONFIG unset" (stored is "") or "SLUICE_CONFIG
// <id>", raised as scriptreply.Raised reads it on either server.
func configReply(err error) (stored string, ok bool) {
	msg, ok := scriptreply.Raised(err)
	if !ok {
		return "", false
	}
	rest, ok := strings.CutPrefix(msg, "SLUICE_CONFIG ")
	if !ok {
		return "", false
	}
	stored, _, _ = strings.Cut(rest, " ")
	if stored == "unset" {
		stored = ""
	}
	return stored, true
}

// run runs script s with the arguments args makes for the configuration q
// runs under. When no configuration is stored yet, it stores q's (unless
// another process was first) and runs the script again; when another is
// in force, it returns a *queueio.ConfigError.
func (q *Queue) run(ctx context.Context, s *redis.Script, keys []string, args func(*conf) ([]any, error)) (any, error) {
	return q.runFor(ctx, s, keys, false, args)
}

// runFor is run; grants says the script's reply may grant callers their
// slots, whose writes then must reach Replicas replicas (replicas.go).
func (q *Queue) runFor(ctx context.Context, s *redis.Script, keys []string, grants bool, args func(*conf) ([]any, error)) (any, error) {
	for try := 0; ; try++ {
		c := q.conf.Load()
		a, err := args(c)
		if err != nil {
			return nil, err
		}
		reply, err := q.eval(ctx, s, keys, a, grants)
		stored, refused := configReply(err)
		switch {
		case !refused:
			return reply, err
		case stored != "" || try > 0:
			return nil, &queueio.ConfigError{Mine: c.id, InForce: stored}
		}
		if err := q.storeMine(ctx, c); err != nil {
			return nil, err
		}
	}
}

// storeMine stores c as the configuration in force, unless one is stored.
func (q *Queue) storeMine(ctx context.Context, c *conf) error {
	return q.rdb.SetNX(ctx, q.keys.Config, protocol.FormatConfig(protocol.Config{Policies: c.policies}), protocol.ConfigTTL).Err()
}

// runInForce is run for calls made on behalf of callers already queued (a
// cancel, a scheduler step): they serve the bucket, not this process's
// own policies, so when another configuration is in force (a live change)
// q follows it, whoever set it, and runs the script again, once.
func (q *Queue) runInForce(ctx context.Context, s *redis.Script, keys []string, args func(*conf) ([]any, error)) (any, error) {
	reply, err := q.run(ctx, s, keys, args)
	var cerr *queueio.ConfigError
	if !errors.As(err, &cerr) {
		return reply, err
	}
	c, ok, rerr := queueio.ReadConfig(ctx, q.rdb, q.keys)
	if rerr != nil || !ok {
		return nil, err
	}
	q.Follow(c)
	return q.run(ctx, s, keys, args)
}

// Run runs script s, whose arguments args makes from the policies as the
// scripts read them (protocol.PolicyArgs), for the whole bucket (the
// scheduler's step): under the configuration in force, which q follows
// when a live change put another in force, whoever set it.
func (q *Queue) Run(ctx context.Context, s *redis.Script, keys []string, args func(policyArgs []any) []any) (any, error) {
	return q.runInForce(ctx, s, keys, func(c *conf) ([]any, error) { return args(c.args), nil })
}

// Follow makes q run under c's policies from now on.
func (q *Queue) Follow(c protocol.Config) {
	if q.conf.Load().id != c.ID() {
		q.conf.Store(newConf(c.Policies))
	}
}

// Change makes next(the configuration in force, the Redis clock now) the
// bucket's configuration for every process, atomically, carrying the
// tokens over by rule (bucket.Carry's values: 0 scales the free tokens by
// new capacity / old capacity, rounded down; 1 keeps them, at most the new
// capacity; 2 fills the bucket, as a new one), and q runs under it
// from then on. next declines with false; it may be called again when the
// configuration in force changed meanwhile, and the ids of the ones
// replaced are kept for it. A new policy inherits the tokens of the old
// policy of its unit at the same rank among that unit's policies (the
// first of unit "pu" from the first of "pu"), and starts full when there
// is none. Callers queued are scheduled under the new policies; those
// with costs of their own keep their cost of each unit, and those whose
// cost a new policy can never grant are dropped (they find themselves
// lost and enter again). When no configuration is stored, q's is stored
// first.
func (q *Queue) Change(ctx context.Context, rule int, next func(old protocol.Config, now time.Time) (protocol.Config, bool)) (queueio.ChangeResult, error) {
	for try := 0; try < 10; try++ {
		old, ok, now, err := q.readConfigNow(ctx)
		if err != nil {
			return queueio.ChangeResult{}, err
		}
		if !ok {
			if err := q.storeMine(ctx, q.conf.Load()); err != nil {
				return queueio.ChangeResult{}, err
			}
			continue
		}
		nc, ok := next(old, now)
		if !ok || nc.ID() == old.ID() {
			q.Follow(old)
			return queueio.ChangeResult{New: old}, nil
		}
		nc.Replaced = slices.DeleteFunc(append([]string{old.ID()}, old.Replaced...), func(id string) bool { return id == nc.ID() })
		args := []any{protocol.FormatConfig(nc), rule, scriptreply.Micros(q.opt.Grace), q.keys.Wake}
		args = append(args, protocol.PolicyArgs(old.Policies)...)
		args = append(args, protocol.PolicyArgs(nc.Policies)...)
		for _, m := range inherit(old.Policies, nc.Policies) {
			args = append(args, m[0], m[1])
		}
		v, err := scriptreply.Ints(changeScript.Run(ctx, q.rdb, []string{q.keys.Queue, q.keys.State, q.keys.Config, q.keys.Lock, q.keys.LaneQueue, q.keys.Classes, q.keys.Class}, args...).Result())
		if err != nil {
			return queueio.ChangeResult{}, err
		}
		if len(v) == 1 && v[0] == 0 {
			continue // changed meanwhile: read it again
		}
		if len(v) != 3 || v[0] != 1 {
			return queueio.ChangeResult{}, fmt.Errorf("%w: change %v", scriptreply.ErrReply, v)
		}
		q.Follow(nc)
		return queueio.ChangeResult{Changed: true, New: nc, Queued: int(v[2])}, nil // v[1] counts the callers dropped
	}
	return queueio.ChangeResult{}, errors.New("queue: the configuration in force kept changing during Change")
}

// readConfigNow is queueio.ReadConfig with the Redis clock's now, in one
// round trip. On Cluster, TIME may come from another node than the
// bucket's: good to a few ms, which is all Change's callers need.
func (q *Queue) readConfigNow(ctx context.Context) (c protocol.Config, ok bool, now time.Time, err error) {
	var t *redis.TimeCmd
	var g *redis.StringCmd
	_, err = q.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		t = p.Time(ctx)
		g = p.Get(ctx, q.keys.Config)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return protocol.Config{}, false, time.Time{}, err
	}
	now = t.Val()
	raw, err := g.Result()
	if errors.Is(err, redis.Nil) {
		return protocol.Config{}, false, now, nil
	}
	if err != nil {
		return protocol.Config{}, false, now, err
	}
	c, err = protocol.ParseConfig(raw)
	return c, err == nil, now, err
}

// inherit pairs each new policy with two old ones (1-based, 0: none): the
// one whose tokens it inherits (same unit, same rank among that unit's
// policies) and the one whose cost a queued caller's cost of its unit is
// (the first of the unit).
func inherit(old, ps []protocol.Policy) [][2]int {
	rank := map[string]int{}
	out := make([][2]int, len(ps))
	for i, p := range ps {
		r := rank[p.Unit]
		rank[p.Unit]++
		seen := 0
		for j, o := range old {
			if o.Unit != p.Unit {
				continue
			}
			if out[i][1] == 0 {
				out[i][1] = j + 1
			}
			if seen == r {
				out[i][0] = j + 1
			}
			seen++
		}
	}
	return out
}
