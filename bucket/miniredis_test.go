package bucket_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/bench/loadgen"
)

// The bucket's contract on miniredis, the in-process server a user's unit
// tests run on (README, "Testing your code"), whether or not redis-server
// is installed: the scripts and the Go side that reads their replies must
// work on both servers. Figures (rates, latencies) are not judged here;
// the promises are, on the Redis clock (miniredis's TIME is the machine's
// clock, as redis-server's is).

// miniClient starts a miniredis for t as a user's test would
// (miniredis.RunT: its keys expire only as its clock is moved, which no
// promise of the bucket waits for) and returns a client of it.
func miniClient(t *testing.T) *redis.Client {
	t.Helper()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), ContextTimeoutEnabled: true})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// TestMiniredisEnter: callers queue at 20/s, burst 2, on miniredis; every
// Enter is granted, the slots keep the limit, no caller starts before its
// slot, and the slots follow arrival order at Redis (tickets).
func TestMiniredisEnter(t *testing.T) {
	rdb := miniClient(t)
	cfg := bucket.Config{Capacity: 2, RefillAmount: 1, RefillFrequency: 50 * time.Millisecond}
	b := newBucket(t, rdb, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a bound on a hang: the grants need 0.8 s
	defer cancel()

	const callers, each = 6, 3
	grants := enterAll(ctx, b, callers, each)
	if len(grants) != callers*each {
		t.Fatalf("%d Enters returned, want %d", len(grants), callers*each)
	}
	checkGrants(t, grants, cfg)
	queued := 0
	for _, g := range grants {
		if g.Position > 0 {
			queued++
		}
	}
	if queued < len(grants)/2 { // all but the first burst's, unless callers came back too slowly
		t.Errorf("%d of %d callers queued: the limit did not bind", queued, len(grants))
	}
	checkArrivalOrder(t, grants)
}

// checkArrivalOrder fails t when a caller got an earlier slot than one
// that reached Redis before it (a lower ticket), or a ticket was given
// twice. A caller later than MaxLateness for its slot takes a later one by
// design (Report.Retimes), and one that claimed a slot its owner did not
// come for an earlier one: they keep no order and are left out.
func checkArrivalOrder(t *testing.T, grants []loadgen.Grant) {
	t.Helper()
	var onTime []loadgen.Grant
	for _, g := range grants {
		if g.OK() && g.Retimes == 0 && g.Claims == 0 {
			onTime = append(onTime, g)
		}
	}
	slices.SortFunc(onTime, func(a, b loadgen.Grant) int { return int(a.Ticket - b.Ticket) })
	for i := 1; i < len(onTime); i++ {
		a, b := onTime[i-1], onTime[i]
		if a.Ticket == 0 || a.Ticket == b.Ticket {
			t.Fatalf("tickets %d and %d: want each granted caller's own, above 0", a.Ticket, b.Ticket)
		}
		if b.Slot < a.Slot {
			t.Errorf("ticket %d got slot %d µs, before ticket %d's %d µs: not in arrival order", b.Ticket, b.Slot, a.Ticket, a.Slot)
		}
	}
}

// TestMiniredisCosts: on miniredis, a bucket of two policies (calls, and
// "pu" units) debits both; Estimate says the wait behind the callers
// queued without taking anything; a reservation settles what it used and
// the rest goes back; a cost above a policy's capacity is refused at once.
func TestMiniredisCosts(t *testing.T) {
	rdb := miniClient(t)
	cfg := bucket.Config{Policies: []bucket.Policy{
		{Capacity: 5, RefillAmount: 1, RefillFrequency: time.Hour},
		{Unit: "pu", Capacity: 100, RefillAmount: 1, RefillFrequency: time.Second},
	}}
	b := newBucket(t, rdb, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a bound on a hang
	defer cancel()

	if err := b.EnterCost(ctx, bucket.Cost{"": 1, "pu": 60}); err != nil {
		t.Fatalf("EnterCost of 60 pu of 100: %v", err)
	}
	// 40 pu left: 60 more wait for 20 refills, 20 s from the grant (and
	// the refill lag of a bucket that was full, ≤ 5 ms), less the time
	// since, well under a second.
	est, err := b.Estimate(ctx, bucket.Cost{"": 1, "pu": 60})
	if err != nil {
		t.Fatal(err)
	}
	if est.Wait < 19*time.Second || est.Wait > 20*time.Second+5*time.Millisecond || est.Ahead != 0 {
		t.Errorf("Estimate of 60 pu with 40 left: wait %v, %d ahead; want about 20s, none ahead", est.Wait, est.Ahead)
	}
	if again, err := b.Estimate(ctx, bucket.Cost{"": 1, "pu": 60}); err != nil || again.Wait > est.Wait {
		t.Errorf("a second Estimate: %+v, %v; want no later than the first's %v (Estimate takes nothing)", again, err, est.Wait)
	}

	r, err := b.Reserve(ctx, bucket.Cost{"": 1, "pu": 30})
	if err != nil {
		t.Fatalf("Reserve of 30 pu: %v", err)
	}
	if got := r.Estimate()["pu"]; got != 30 {
		t.Errorf("reserved %d pu, want 30", got)
	}
	// 10 pu left while reserved: 30 more would wait.
	if est, err := b.Estimate(ctx, bucket.Cost{"": 1, "pu": 30}); err != nil || est.Wait < 10*time.Second {
		t.Errorf("Estimate of 30 pu with about 10 left: %+v, %v; want a wait of about 20s", est, err)
	}
	if err := r.Settle(ctx, bucket.Cost{"pu": 5}); err != nil {
		t.Fatalf("Settle 5 of 30 pu: %v", err)
	}
	// The 25 pu not used are back: 35 left.
	if est, err := b.Estimate(ctx, bucket.Cost{"": 1, "pu": 30}); err != nil || est.Wait != 0 {
		t.Errorf("Estimate of 30 pu after settling 5 of 30: %+v, %v; want no wait (the 25 unused pu came back)", est, err)
	}

	for _, c := range []bucket.Cost{{"": 1, "pu": 101}, {"": 6}} {
		err := b.EnterCost(ctx, c)
		if !errors.Is(err, sluice.ErrCostExceedsCapacity) || errors.Is(err, sluice.ErrLimited) {
			t.Errorf("EnterCost(%v) = %v; want sluice.ErrCostExceedsCapacity, not ErrLimited", c, err)
		}
	}
}

// TestMiniredisRefusals: on miniredis, a process whose policies differ
// from those stored is refused with sluice.ErrConfigMismatch, and a caller
// whose ctx ends before its turn could come is refused at once with
// sluice.ErrWaitTooLong, taking no place.
func TestMiniredisRefusals(t *testing.T) {
	rdb := miniClient(t)
	cfg := bucket.Config{Name: t.Name(), Capacity: 1, RefillAmount: 1, RefillFrequency: time.Hour}
	b := newBucket(t, rdb, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a bound on a hang
	defer cancel()
	if err := b.Enter(ctx); err != nil {
		t.Fatalf("the first Enter of a full bucket: %v", err)
	}

	// The next token comes in an hour: a caller with a second to live is
	// told at once.
	short, stop := context.WithTimeout(ctx, time.Second)
	err := b.Enter(short)
	stop()
	var wtl *sluice.WaitTooLongError
	if !errors.Is(err, sluice.ErrWaitTooLong) || !errors.As(err, &wtl) || !wtl.Deadline || wtl.Wait < 59*time.Minute {
		t.Errorf("Enter with 1s to live, the next token in 1h: %v; want sluice.ErrWaitTooLong, bound by its deadline, estimating about 1h", err)
	}
	if est, err := b.Estimate(ctx, nil); err != nil || est.Ahead != 0 {
		t.Errorf("after the refusal: %+v, %v; want nobody queued (the refused caller took no place)", est, err)
	}

	other := cfg
	other.Capacity = 2
	o := newBucket(t, rdb, other) // another process's handle, with other policies
	err = o.Enter(ctx)
	var mismatch *sluice.ConfigMismatchError
	if !errors.Is(err, sluice.ErrConfigMismatch) || !errors.As(err, &mismatch) || mismatch.Name != t.Name() {
		t.Errorf("Enter with capacity 2 where 1 is in force: %v; want a *sluice.ConfigMismatchError", err)
	}
}

// TestMiniredisReplicaAcks: miniredis has no replicas (its WAIT answers 0
// at once): a bucket that wants its grants acknowledged by one fails each
// Enter with ErrNotReplicated, promptly, rather than waiting.
func TestMiniredisReplicaAcks(t *testing.T) {
	rdb := miniClient(t)
	b := newBucket(t, rdb, bucket.Config{Capacity: 5, RefillAmount: 1, RefillFrequency: time.Second, ReplicaAcks: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second) // a bound on a hang
	defer cancel()
	err := b.Enter(ctx)
	if !errors.Is(err, bucket.ErrNotReplicated) || ctx.Err() != nil {
		t.Errorf("Enter wanting 1 replica's ack on miniredis: %v (ctx %v); want bucket.ErrNotReplicated before the ctx ends", err, ctx.Err())
	}
}

// TestMiniredisHold: on miniredis, a hold of one unit's policies keeps
// the callers who take from them back until its end, and not the others;
// a second hold, of another unit, holds both (the scripts' bitmask of
// held policies, which miniredis's Lua, without a bit library, computes
// by arithmetic).
func TestMiniredisHold(t *testing.T) {
	rdb := miniClient(t)
	b := newBucket(t, rdb, bucket.Config{Policies: []bucket.Policy{
		{Capacity: 100, RefillAmount: 1, RefillFrequency: time.Second},
		{Unit: "pu", Capacity: 100, RefillAmount: 1, RefillFrequency: time.Second},
	}})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // a bound on a hang
	defer cancel()
	wait := func(c bucket.Cost) time.Duration {
		t.Helper()
		est, err := b.Estimate(ctx, c)
		if err != nil {
			t.Fatalf("Estimate(%v): %v", c, err)
		}
		return est.Wait
	}
	if _, err := b.Hold(ctx, time.Hour, "pu"); err != nil {
		t.Fatalf("Hold of pu: %v", err)
	}
	if w := wait(bucket.Cost{"": 1, "pu": 1}); w < 59*time.Minute {
		t.Errorf("a caller of 1 pu during an hour's hold of pu waits %v; want about 1h", w)
	}
	if w := wait(bucket.Cost{"": 1}); w != 0 {
		t.Errorf("a caller of no pu during a hold of pu waits %v; want 0", w)
	}
	if _, err := b.Hold(ctx, time.Minute, ""); err != nil {
		t.Fatalf("Hold of calls: %v", err)
	}
	if w := wait(bucket.Cost{"": 1}); w < 59*time.Minute {
		t.Errorf("a caller of no pu once calls are held too waits %v; want about 1h (the later hold's end, over both)", w)
	}
}
