package bucket_test

import (
	"context"
	"errors"
	"github.com/sluicehq/sluice"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// tokensOnly is a bucket of one policy counting "tokens" that refills too
// slowly to change during a test: its level moves only by what the test
// takes and gives back.
func tokensOnly(name string, capacity int) bucket.Config {
	return bucket.Config{Name: name, Policies: []bucket.Policy{
		{Unit: "tokens", Capacity: capacity, RefillAmount: 1, RefillFrequency: time.Hour},
	}}
}

// levels reads every policy's tokens now.
func levels(t *testing.T, b *bucket.Bucket) []int64 {
	t.Helper()
	in, err := b.Inspect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	out := make([]int64, len(in.Levels))
	for i, l := range in.Levels {
		out[i] = l.Tokens
	}
	return out
}

func wantLevels(t *testing.T, b *bucket.Bucket, what string, want ...int64) {
	t.Helper()
	got := levels(t, b)
	if len(got) != len(want) {
		t.Fatalf("%s: levels %v, want %v", what, got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("%s: levels %v, want %v", what, got, want)
		}
	}
}

// TestSettleDown: a reservation settled below its estimate gives the rest
// back at once, and the next caller has it; a full bucket keeps no more
// than its capacity.
func TestSettleDown(t *testing.T) {
	ctx := context.Background()
	srv := redistest.New(t)
	b := newBucket(t, clientOf(t, srv), tokensOnly(t.Name(), 100))
	r, err := b.Reserve(ctx, bucket.Cost{"tokens": 60})
	if err != nil {
		t.Fatal(err)
	}
	wantLevels(t, b, "after Reserve of 60", 40)
	if err := r.Settle(ctx, bucket.Cost{"tokens": 10}); err != nil {
		t.Fatal(err)
	}
	wantLevels(t, b, "after Settle at 10", 90)
	// The 50 given back let an 80 through at once.
	rep, err := b.EnterReport(ctx, bucket.Cost{"tokens": 80})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Position != 0 {
		t.Fatalf("a cost of 80 queued at position %d with 90 tokens free", rep.Position)
	}
	wantLevels(t, b, "after Enter of 80", 10)
}

// TestSettleCapsAtCapacity: what a full bucket cannot hold is lost.
func TestSettleCapsAtCapacity(t *testing.T) {
	ctx := context.Background()
	srv := redistest.New(t)
	cfg := bucket.Config{Name: t.Name(), Policies: []bucket.Policy{
		{Unit: "tokens", Capacity: 100, RefillAmount: 50, RefillFrequency: 50 * time.Millisecond},
	}}
	b := newBucket(t, clientOf(t, srv), cfg)
	r, err := b.Reserve(ctx, bucket.Cost{"tokens": 80})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the bucket to refill", func() bool { return levels(t, b)[0] == 100 })
	if err := r.Settle(ctx, bucket.Cost{"tokens": 0}); err != nil {
		t.Fatal(err)
	}
	if l := levels(t, b)[0]; l != 100 {
		t.Fatalf("level %d after a give-back to a full bucket, want 100", l)
	}
}

// TestSettleUp: a reservation settled above its estimate takes the rest
// as a debt, without waiting: the callers after it wait it out.
func TestSettleUp(t *testing.T) {
	ctx := context.Background()
	srv := redistest.New(t)
	cfg := bucket.Config{Name: t.Name(), Policies: []bucket.Policy{
		{Unit: "tokens", Capacity: 100, RefillAmount: 1, RefillFrequency: time.Second},
	}}
	b := newBucket(t, clientOf(t, srv), cfg)
	r, err := b.Reserve(ctx, bucket.Cost{"tokens": 100})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Settle(ctx, bucket.Cost{"tokens": 150}); err != nil {
		t.Fatal(err)
	}
	if l := levels(t, b)[0]; l > -45 || l < -50 {
		t.Fatalf("level %d after a debt of 50 on an empty bucket (1 token a second), want -50 to -45", l)
	}
	e, err := b.Estimate(ctx, bucket.Cost{"tokens": 10})
	if err != nil {
		t.Fatal(err)
	}
	if e.Wait < 50*time.Second {
		t.Fatalf("a caller of 10 after a debt of 50 would wait %v, want ≥ 50s (60 tokens at 1/s)", e.Wait)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if err := b.EnterCost(short, bucket.Cost{"tokens": 1}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Enter of 1 during the debt: %v, want it to wait past its deadline", err)
	}
}

// TestCancelGivesAllBack: Cancel returns the estimate to every policy,
// calls included.
func TestCancelGivesAllBack(t *testing.T) {
	ctx := context.Background()
	srv := redistest.New(t)
	cfg := tokensOnly(t.Name(), 100)
	cfg.Capacity, cfg.RefillAmount, cfg.RefillFrequency = 5, 1, time.Hour
	b := newBucket(t, clientOf(t, srv), cfg)
	r, err := b.Reserve(ctx, bucket.Cost{"": 1, "tokens": 30})
	if err != nil {
		t.Fatal(err)
	}
	wantLevels(t, b, "after Reserve", 4, 70)
	if err := r.Cancel(ctx); err != nil {
		t.Fatal(err)
	}
	wantLevels(t, b, "after Cancel", 5, 100)
	// Enter's cost (nil) settled with only tokens keeps its call.
	r, err = b.Reserve(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Settle(ctx, bucket.Cost{"tokens": 7}); err != nil {
		t.Fatal(err)
	}
	wantLevels(t, b, "after Reserve(nil) settled at 7 tokens", 4, 93)
}

// TestSettleErrors: bad input and a second settle are refused before
// anything is charged; a failed call leaves the reservation open.
func TestSettleErrors(t *testing.T) {
	ctx := context.Background()
	srv := redistest.New(t)
	b := newBucket(t, clientOf(t, srv), tokensOnly(t.Name(), 100))
	r, err := b.Reserve(ctx, bucket.Cost{"tokens": 20})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Settle(ctx, bucket.Cost{"tokens": -1}); err == nil {
		t.Fatal("Settle with a negative cost: no error")
	}
	if err := r.Settle(ctx, bucket.Cost{"pu": 3}); err == nil {
		t.Fatal("Settle of a unit no policy counts: no error")
	}
	dead, cancel := context.WithCancel(ctx)
	cancel()
	if err := r.Settle(dead, bucket.Cost{"tokens": 5}); !errors.Is(err, context.Canceled) {
		t.Fatalf("Settle with a cancelled context: %v", err)
	}
	wantLevels(t, b, "after refused settles", 80)
	// Twenty goroutines settle at once: one counts.
	var wg sync.WaitGroup
	var mu sync.Mutex
	ok, refused := 0, 0
	for range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := r.Settle(ctx, bucket.Cost{"tokens": 5})
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				ok++
			case errors.Is(err, bucket.ErrReservationSettled):
				refused++
			default:
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if ok != 1 || refused != 19 {
		t.Fatalf("%d settles counted, %d refused; want 1 and 19", ok, refused)
	}
	wantLevels(t, b, "after one settle at 5", 95)
	if err := r.Cancel(ctx); !errors.Is(err, bucket.ErrReservationSettled) {
		t.Fatalf("Cancel after Settle: %v", err)
	}
	// Past ReservationTTL, a reservation counts at its estimate for good.
	cfg := tokensOnly(t.Name()+"-ttl", 100)
	cfg.ReservationTTL = time.Millisecond
	b2 := newBucket(t, clientOf(t, srv), cfg)
	r2, err := b2.Reserve(ctx, bucket.Cost{"tokens": 20})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * time.Millisecond) // past the TTL, on the local clock the TTL is judged on
	if err := r2.Settle(ctx, bucket.Cost{"tokens": 0}); !errors.Is(err, bucket.ErrReservationSettled) {
		t.Fatalf("Settle past ReservationTTL: %v", err)
	}
	wantLevels(t, b2, "after a settle past the TTL", 80)
	if _, err := bucket.New(clientOf(t, srv), bucket.Config{Name: "x", Capacity: 1, RefillAmount: 1, RefillFrequency: time.Second, ReservationTTL: -time.Second}); !errors.Is(err, sluice.ErrConfig) {
		t.Fatalf("negative ReservationTTL: %v", err)
	}
}

// TestReservationAbandoned: a process that dies holding a reservation
// leaves it counted at its estimate; the others go on.
func TestReservationAbandoned(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	cfg := tokensOnly(t.Name(), 100)
	cfg.Capacity, cfg.RefillAmount, cfg.RefillFrequency = 5, 1, time.Hour // the worker's callers cost a call too
	p := startWorker(t, loadgen.Spec{Proc: 1, Addr: srv.Addr(), Bucket: cfg, Callers: 1, Enters: 1, Announce: true,
		CostUnit: "tokens", CostMin: 70, CostMax: 70, SettleMin: 10, SettleMax: 10, Work: time.Hour})
	waitFor(t, 20*time.Second, "the worker's reservation", func() bool {
		for _, g := range p.Pending() {
			if g.Reserved {
				return true
			}
		}
		return false
	})
	if err := p.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.Done()
	b := newBucket(t, clientOf(t, srv), cfg)
	wantLevels(t, b, "after the holder died", 4, 30)
	short, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := b.EnterCost(short, bucket.Cost{"": 1, "tokens": 31}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Enter of 31 with 30 left: %v", err)
	}
	if err := b.EnterCost(context.Background(), bucket.Cost{"": 1, "tokens": 30}); err != nil {
		t.Fatal(err)
	}
}

// TestSettlesAcrossProcesses: three worker processes reserve random
// estimates and settle at 30 % to 130 % of them; counting each estimate
// at its slot and each settle's give-back or debt when it happened, the
// bucket's promise holds in every window, up to the tokens promised to
// slots not yet due at a settle (docs/guarantees.md, "Settling").
func TestSettlesAcrossProcesses(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	cfg := bucket.Config{Name: t.Name(), Capacity: 20, RefillAmount: 1, RefillFrequency: 5 * time.Millisecond,
		Policies: []bucket.Policy{{Unit: "tokens", Capacity: 2000, RefillAmount: 10, RefillFrequency: time.Millisecond}}}
	var procs []*loadgen.Proc
	for i := range 3 {
		procs = append(procs, startWorker(t, loadgen.Spec{Proc: i, Addr: srv.Addr(), Bucket: cfg, Callers: 20, Until: 2 * time.Second,
			CostUnit: "tokens", CostMin: 50, CostMax: 300, SettleMin: 30, SettleMax: 130, Work: 5 * time.Millisecond}))
	}
	var all []loadgen.Grant
	for _, p := range procs {
		all = append(all, wait(t, p)...)
	}
	var charges []guarantee.Grant
	var settles []time.Time
	var calls []time.Time
	var estimated, actual, debts int
	for _, g := range all {
		if !g.OK() || g.SettleErr != "" {
			t.Fatalf("a caller failed: %q %q", g.Err, g.SettleErr)
		}
		calls = append(calls, g.SlotTime())
		charges = append(charges, guarantee.Grant{At: g.SlotTime(), Cost: g.Cost})
		d := g.Actual - g.Cost
		switch {
		case d > 0: // a debt: as early as it may have been charged
			charges = append(charges, guarantee.Grant{At: time.Unix(0, g.SettleSent), Cost: d})
			debts += d
		case d < 0: // a give-back: as late
			charges = append(charges, guarantee.Grant{At: time.Unix(0, g.SettleDone), Cost: d})
		}
		settles = append(settles, time.Unix(0, g.SettleSent))
		estimated += g.Cost
		actual += g.Actual
	}
	if len(all) < 100 {
		t.Fatalf("only %d reservations", len(all))
	}
	p := cfg.Policies[0]
	lim := guarantee.Limit{Capacity: p.Capacity, RefillAmount: p.RefillAmount, RefillFrequency: p.RefillFrequency}
	r := guarantee.CheckCharges(charges, lim, 0)
	// A settle while callers hold slots not yet due (handed out within
	// the lookahead, 20 ms, before them) may show above the promise by
	// at most those callers' costs (docs/guarantees.md, "Settling"): the
	// most promised at any settle, to slots in the 25 ms after it.
	slack := 0
	for _, c := range settles {
		sum := 0
		for _, g := range all {
			if d := g.SlotTime().Sub(c); d > 0 && d <= 25*time.Millisecond {
				sum += g.Cost
			}
		}
		slack = max(slack, sum)
	}
	if r.Excess > slack {
		t.Errorf("tokens: %v, above the tokens promised at a settle (%d)", r, slack)
	}
	if c := guarantee.Check(calls, limitOf(cfg)); !c.OK() {
		t.Errorf("calls: %v", c)
	}
	// Saturated: what was used is close to what the policy allows.
	span := all[0].SlotTime()
	last := span
	for _, g := range all {
		if g.SlotTime().Before(span) {
			span = g.SlotTime()
		}
		if g.SlotTime().After(last) {
			last = g.SlotTime()
		}
	}
	allowed := lim.Allowed(last.Sub(span))
	t.Logf("%d reservations, %d tokens estimated, %d used (%d debt), %d allowed over %v; worst window %v; most promised at a settle %d",
		len(all), estimated, actual, debts, allowed, last.Sub(span), r, slack)
	if actual < allowed*6/10 {
		t.Errorf("used %d tokens of %d allowed: the give-backs were not used", actual, allowed)
	}
}

// clientOf is a client of srv, closed when the test ends (after the
// buckets made on it, which close first).
func clientOf(t *testing.T, srv *redistest.Server) *redis.Client {
	t.Helper()
	rdb := srv.Client()
	t.Cleanup(func() { rdb.Close() })
	return rdb
}
