package bucket

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/internal/configerr"
	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
)

// The limits in Redis. A bucket's policies are stored in Redis with its
// state (protocol.Config); every script checks, at no extra cost while they
// agree, that it runs under the policies in force, and changes nothing
// when it does not. This file decides what a process does then: follow
// the policies in force, or fail with sluice.ErrConfigMismatch.

// Carry says how a live change (SetPolicies) carries each policy's tokens
// over to the new policies. The zero value is Proportionally. The rules
// are bucket4j's (TokensInheritanceStrategy).
type Carry int

const (
	// Proportionally scales the free tokens by new capacity ÷ old
	// capacity, rounded down: a bucket half full stays half full.
	Proportionally Carry = iota
	// AsIs keeps the free tokens, at most the new capacity.
	AsIs
	// Fill fills every policy, as a new bucket: the new capacity at once.
	Fill
)

// Policies returns the policies in force for every process, as stored in
// Redis: the first is the one counting calls when Config.Capacity set it.
// When none are stored yet, this process's are stored (as its first Enter
// would). It does not fail when they differ from this process's own
// (Config); Enter does, unless this process follows them.
func (b *Bucket) Policies(ctx context.Context) ([]Policy, error) {
	for range 3 {
		c, ok, err := queueio.ReadConfig(ctx, b.reads, b.keys)
		if err != nil {
			return nil, b.redisErr(ctx, err)
		}
		if ok {
			b.follow(c)
			return fromQueue(c.Policies), nil
		}
		if _, _, err := b.q.Estimate(ctx, "", nil); err != nil && !errors.As(err, new(*queueio.ConfigError)) {
			return nil, b.redisErr(ctx, err) // it stores this process's policies when none are
		}
	}
	return nil, fmt.Errorf("bucket: no policies stored for bucket %q", b.cfg.Name)
}

// SetPolicies changes the bucket's policies for every process at once,
// atomically in Redis: callers already queued, in any process, are
// scheduled under the new policies from then on, and each policy's tokens
// carry over by carry's rule. A new policy takes over from the old policy
// of its unit at the same rank among that unit's policies (the first
// policy counting "pu" from the first one counting "pu"); one without
// such a predecessor starts full. Slots already assigned (due within the
// lookahead) keep their times and their tokens stay owed: after a change
// down, a window shorter than the lookahead may hold those old-rate slots
// beyond the new burst (docs/limits.md). A queued caller with a cost of its own
// keeps its cost of each unit; one whose cost a new policy could never
// grant fails with sluice.ErrCostExceedsCapacity. Processes started with the
// replaced policies follow the new ones (they learn them at their next
// call to Redis); those with other policies go on failing with
// sluice.ErrConfigMismatch unless Adopt is set.
//
// policies must hold every policy of the bucket (use Unit "" for the one
// counting calls), each valid as in Config.
func (b *Bucket) SetPolicies(ctx context.Context, carry Carry, policies ...Policy) error {
	if len(policies) == 0 {
		return configerr.Invalid(errConfig, "SetPolicies with no policy")
	}
	for i, p := range policies {
		if err := checkPolicy(p, fmt.Sprintf("policies[%d] ", i)); err != nil {
			return err
		}
	}
	policies = slices.Clone(policies)
	if err := windows(policies, b.cfg.Lookahead, "policies"); err != nil {
		return err
	}
	if carry < Proportionally || carry > Fill {
		return configerr.Invalid(errConfig, "Carry %d, want Proportionally, AsIs or Fill", carry)
	}
	ps := toQueue(policies)
	r, err := b.q.Change(ctx, int(carry), func(protocol.Config, time.Time) (protocol.Config, bool) {
		return protocol.Config{Policies: ps}, true
	})
	if err != nil {
		return b.redisErr(ctx, err)
	}
	if r.Queued > 0 {
		b.sched.Ensure() // the change released the lock: step under the new policies now
	}
	return nil
}

// inForce returns the policies this process enforces now: its own, or
// those in force that it follows.
func (b *Bucket) inForce() []Policy {
	return fromQueue(b.q.Options().Policies)
}

// runsUnder returns the policies b's queue runs under now, as the scripts
// take them, and their configuration id.
func (b *Bucket) runsUnder() (id string, ps []protocol.Policy) {
	ps = b.q.Options().Policies
	return protocol.ConfigID(ps), ps
}

// followInForce decides what a call that found another configuration in force
// (err a *queueio.ConfigError) does: it reports retry when this process now
// runs under the policies in force, and an error wrapping a
// *sluice.ConfigMismatchError when it may not follow them. Any other err is not
// followInForce's: it returns (false, nil).
func (b *Bucket) followInForce(ctx context.Context, err error, settled int) (retry bool, _ error) {
	var cerr *queueio.ConfigError
	if !errors.As(err, &cerr) {
		return false, nil
	}
	if settled >= 3 {
		return false, fmt.Errorf("bucket: the policies in force kept changing: %w", err)
	}
	if cerr.InForce == "" {
		return true, nil // costs of the policies this process just left: take them again
	}
	c, ok, rerr := queueio.ReadConfig(ctx, b.reads, b.keys)
	if rerr != nil {
		return false, b.redisErr(ctx, rerr)
	}
	if !ok || b.follow(c) {
		return true, nil
	}
	if l := b.cfg.Logger; l != nil {
		l.Warn("sluice: this process's policies differ from the ones in force; refusing them (set Config.Adopt to follow)",
			"bucket", b.cfg.Name, "mine", describeAll(b.policies), "in_force", describeAll(fromQueue(c.Policies)))
	}
	return false, fmt.Errorf("%w (stored by the first process to use the bucket, or by SetPolicies); set Config.Adopt to follow the policies in force",
		&sluice.ConfigMismatchError{Limiter: "bucket", Name: b.cfg.Name, Mine: describeAll(b.policies), InForce: describeAll(fromQueue(c.Policies))})
}

// follow makes this process run under c when it may: its own policies
// are c's or were replaced by c, it follows already, or Config.Adopt.
func (b *Bucket) follow(c protocol.Config) bool {
	cur, _ := b.runsUnder()
	if !b.cfg.Adopt && !c.Follows(b.ownID) && !c.Follows(cur) {
		return false
	}
	if l := b.cfg.Logger; l != nil && cur != c.ID() {
		l.Info("sluice: following the policies in force", "bucket", b.cfg.Name, "policies", describeAll(fromQueue(c.Policies)))
	}
	b.q.Follow(c)
	b.noteFactor(c)
	b.back.forget() // learned under the policies left
	return true
}

// changed is told by the wake channel that the configuration id is now in
// force (change.lua): this process follows it at once, if it may, rather
// than at its next call.
func (b *Bucket) changed(id string) {
	if cur, _ := b.runsUnder(); cur == id {
		return
	}
	b.bg.Go(func(ctx context.Context) {
		ctx, cancel := context.WithTimeout(ctx, b.cfg.LockTTL)
		defer cancel()
		if c, ok, err := queueio.ReadConfig(ctx, b.reads, b.keys); err == nil && ok {
			b.follow(c)
		}
	})
}

func toQueue(ps []Policy) []protocol.Policy {
	out := make([]protocol.Policy, len(ps))
	for i, p := range ps {
		out[i] = protocol.Policy{Unit: p.Unit, Capacity: int64(p.Capacity), RefillAmount: int64(p.RefillAmount), RefillFrequency: p.RefillFrequency, Kind: protocol.Kind(p.Kind)}
	}
	return out
}

func fromQueue(ps []protocol.Policy) []Policy {
	out := make([]Policy, len(ps))
	for i, p := range ps {
		out[i] = Policy{Unit: p.Unit, Capacity: int(p.Capacity), RefillAmount: int(p.RefillAmount), RefillFrequency: p.RefillFrequency, Kind: Kind(p.Kind)}
	}
	return out
}

// describeAll is a list of policies as errors show it.
func describeAll(ps []Policy) string {
	parts := make([]string, len(ps))
	for i, p := range ps {
		parts[i] = describe(p)
	}
	return "[" + strings.Join(parts, "; ") + "]"
}
