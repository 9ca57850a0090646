package local

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluicehq/sluice"
)

func TestNewRateValidates(t *testing.T) {
	tests := []struct {
		name string
		cfg  RateConfig
		ok   bool
	}{
		{"minimal", RateConfig{Rate: 1}, true},
		{"full", RateConfig{Rate: 5, Period: time.Minute, Burst: 2, MaxQueue: 3, MaxWait: time.Second}, true},
		{"zero rate", RateConfig{}, false},
		{"negative rate", RateConfig{Rate: -1}, false},
		{"negative period", RateConfig{Rate: 1, Period: -time.Second}, false},
		{"negative burst", RateConfig{Rate: 1, Burst: -1}, false},
		{"huge burst", RateConfig{Rate: 1, Burst: math.MaxInt}, true},
		{"negative max queue", RateConfig{Rate: 1, MaxQueue: -1}, false},
		{"negative max wait", RateConfig{Rate: 1, MaxWait: -time.Second}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := NewRate(tt.cfg)
			if tt.ok && (err != nil || r == nil) {
				t.Fatalf("NewRate(%+v) = %v, %v; want a limiter", tt.cfg, r, err)
			}
			if !tt.ok && (!errors.Is(err, errConfig) || r != nil) {
				t.Fatalf("NewRate(%+v) = %v, %v; want errConfig", tt.cfg, r, err)
			}
			if !tt.ok && errors.Is(err, sluice.ErrLimited) {
				t.Fatalf("config error %v must not look like a refusal", err)
			}
		})
	}
}

func TestRateScript(t *testing.T) {
	const s = time.Second
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	tests := []struct {
		name   string
		cfg    RateConfig
		script []arrival
		want   []outcome
	}{
		{
			name:   "fifo at the rate",
			cfg:    RateConfig{Rate: 1},
			script: []arrival{{}, {}, {}},
			want:   []outcome{{0, nil}, {s, nil}, {2 * s, nil}},
		},
		{
			name:   "period",
			cfg:    RateConfig{Rate: 2, Period: 3 * s},
			script: []arrival{{}, {}, {}},
			want:   []outcome{{0, nil}, {ms(1500), nil}, {3 * s, nil}},
		},
		{
			name:   "first call on a new limiter does not wait",
			cfg:    RateConfig{Rate: 1, Period: time.Hour},
			script: []arrival{{at: ms(10)}},
			want:   []outcome{{ms(10), nil}},
		},
		{
			name:   "burst then the rate",
			cfg:    RateConfig{Rate: 1, Burst: 3},
			script: []arrival{{}, {}, {}, {}},
			want:   []outcome{{0, nil}, {0, nil}, {0, nil}, {s, nil}},
		},
		{
			name:   "burst 1 is no burst, as burst 0",
			cfg:    RateConfig{Rate: 1, Burst: 1},
			script: []arrival{{}, {}, {}},
			want:   []outcome{{0, nil}, {s, nil}, {2 * s, nil}},
		},
		{
			name:   "burst is regained from idle time only",
			cfg:    RateConfig{Rate: 1, Burst: 2},
			script: []arrival{{}, {}, {}, {at: 10 * s}, {at: 10 * s}, {at: 10 * s}},
			want:   []outcome{{0, nil}, {0, nil}, {s, nil}, {10 * s, nil}, {10 * s, nil}, {11 * s, nil}},
		},
		{
			// The second caller finds 3 tokens, too few for its cost of 4,
			// and the third, which 3 tokens would do, waits behind it.
			name:   "a cost at the front holds back the cheap callers behind it",
			cfg:    RateConfig{Rate: 1, Burst: 4},
			script: []arrival{{cost: 1}, {cost: 4}, {cost: 1}, {}},
			want:   []outcome{{0, nil}, {s, nil}, {2 * s, nil}, {3 * s, nil}},
		},
		{
			name:   "a cost spends the burst",
			cfg:    RateConfig{Rate: 2, Burst: 6},
			script: []arrival{{cost: 6}, {cost: 2}, {}, {at: 10 * s, cost: 6}, {at: 10 * s}},
			want:   []outcome{{0, nil}, {s, nil}, {ms(1500), nil}, {10 * s, nil}, {ms(10500), nil}},
		},
		{
			name:   "a cost above the burst is refused at once and takes nothing",
			cfg:    RateConfig{Rate: 1, Burst: 2},
			script: []arrival{{}, {cost: 3}, {cost: 1000}, {}, {}},
			want:   []outcome{{0, nil}, {0, sluice.ErrCostExceedsCapacity}, {0, sluice.ErrCostExceedsCapacity}, {0, nil}, {s, nil}},
		},
		{
			name:   "max queue counts callers, not costs",
			cfg:    RateConfig{Rate: 1, Burst: 5, MaxQueue: 2},
			script: []arrival{{cost: 5}, {cost: 5}, {cost: 5}, {cost: 1}, {at: 6 * s}},
			want:   []outcome{{0, nil}, {5 * s, nil}, {10 * s, nil}, {0, sluice.ErrQueueFull}, {11 * s, nil}},
		},
		{
			// At 0 the front (cost 1) is due in 1 s, and a cost of 2 would
			// wait 1+2 s. Queued behind it, that cost makes a caller of
			// cost 1 wait 1+2+1 s. At 1.5 s the cost of 2 is the front,
			// due at 3 s, and a caller of cost 1 would wait 2.5 s. (MaxWait
			// has 1 ms to spare for the rounding guard's nanoseconds.)
			name:   "max wait counts the costs of the callers ahead",
			cfg:    RateConfig{Rate: 1, Burst: 4, MaxWait: ms(3001)},
			script: []arrival{{cost: 4}, {cost: 1}, {cost: 2}, {cost: 1}, {at: ms(1500), cost: 1}},
			want:   []outcome{{0, nil}, {s, nil}, {3 * s, nil}, {0, sluice.ErrWaitTooLong}, {4 * s, nil}},
		},
		{
			name:   "max queue refuses at once",
			cfg:    RateConfig{Rate: 1, MaxQueue: 2},
			script: []arrival{{}, {}, {}, {}, {at: ms(1500)}},
			want:   []outcome{{0, nil}, {s, nil}, {2 * s, nil}, {0, sluice.ErrQueueFull}, {3 * s, nil}},
		},
		{
			name:   "max wait counts the sleeper's remaining time",
			cfg:    RateConfig{Rate: 1, MaxWait: ms(1500)},
			script: []arrival{{}, {}, {at: ms(450)}, {at: ms(550)}},
			// At 450 ms the second caller still sleeps 550 ms, so the third
			// would wait 550+1000 ms; at 550 ms, 450+1000 ms.
			want: []outcome{{0, nil}, {s, nil}, {ms(450), sluice.ErrWaitTooLong}, {2 * s, nil}},
		},
		{
			name:   "cancelled sleeper gives its slot to the next",
			cfg:    RateConfig{Rate: 1},
			script: []arrival{{}, {cancelAt: ms(500)}, {}, {}},
			want:   []outcome{{0, nil}, {ms(500), context.DeadlineExceeded}, {s, nil}, {2 * s, nil}},
		},
		{
			name:   "cancelled waiter in the middle leaves no hole",
			cfg:    RateConfig{Rate: 1},
			script: []arrival{{}, {}, {cancelAt: ms(500)}, {}},
			want:   []outcome{{0, nil}, {s, nil}, {ms(500), context.DeadlineExceeded}, {2 * s, nil}},
		},
		{
			name:   "everyone cancels: the next caller waits only for the rate",
			cfg:    RateConfig{Rate: 1},
			script: []arrival{{}, {cancelAt: ms(100)}, {cancelAt: ms(200)}, {cancelAt: ms(300)}, {at: ms(400)}},
			want: []outcome{
				{0, nil}, {ms(100), context.DeadlineExceeded}, {ms(200), context.DeadlineExceeded},
				{ms(300), context.DeadlineExceeded}, {s, nil},
			},
		},
		{
			name:   "already cancelled",
			cfg:    RateConfig{Rate: 1},
			script: []arrival{{at: ms(1), cancelAt: ms(1)}, {at: ms(2)}},
			want:   []outcome{{ms(1), context.DeadlineExceeded}, {ms(2), nil}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r, err := NewRate(tt.cfg)
				if err != nil {
					t.Fatal(err)
				}
				checkOutcomes(t, play(t, r, tt.script), tt.want)
				if n := r.Waiting(); n != 0 {
					t.Errorf("Waiting() = %d after the script, want 0", n)
				}
			})
		})
	}
}

// TestRateRefusalsConsumeNothing plays each script twice, with and without
// the callers that get refused, and wants the same start times for the others.
func TestRateRefusalsConsumeNothing(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	tests := []struct {
		name    string
		cfg     RateConfig
		script  []arrival
		refused map[int]bool
		err     error
	}{
		{
			name:    "queue full",
			cfg:     RateConfig{Rate: 1, MaxQueue: 1},
			script:  []arrival{{}, {}, {}, {at: ms(1500)}, {at: ms(1500)}, {at: ms(2500)}, {at: ms(2600)}, {at: ms(2700)}},
			refused: map[int]bool{2: true, 4: true, 6: true, 7: true},
			err:     sluice.ErrQueueFull,
		},
		{
			name:    "wait too long",
			cfg:     RateConfig{Rate: 1, MaxWait: ms(1500)},
			script:  []arrival{{}, {}, {}, {at: ms(600)}, {at: ms(600)}, {at: ms(2100)}, {at: ms(2100)}},
			refused: map[int]bool{2: true, 4: true, 6: true},
			err:     sluice.ErrWaitTooLong,
		},
		{
			name:    "queue full with costs",
			cfg:     RateConfig{Rate: 1, Burst: 4, MaxQueue: 2},
			script:  []arrival{{cost: 4}, {cost: 3}, {cost: 2}, {cost: 4}, {at: ms(2500), cost: 1}, {at: ms(3500), cost: 4}},
			refused: map[int]bool{3: true, 4: true},
			err:     sluice.ErrQueueFull,
		},
		{
			name:    "wait too long with costs",
			cfg:     RateConfig{Rate: 1, Burst: 4, MaxWait: ms(2500)},
			script:  []arrival{{cost: 4}, {cost: 2}, {cost: 1}, {at: ms(1000), cost: 3}, {at: ms(1200), cost: 1}, {at: ms(2600), cost: 2}},
			refused: map[int]bool{2: true, 3: true},
			err:     sluice.ErrWaitTooLong,
		},
		{
			name:    "cost above the burst",
			cfg:     RateConfig{Rate: 1, Burst: 3},
			script:  []arrival{{cost: 3}, {cost: 4}, {cost: 2}, {at: ms(500), cost: 9}, {at: ms(500), cost: 1}},
			refused: map[int]bool{1: true, 3: true},
			err:     sluice.ErrCostExceedsCapacity,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkAsIfAbsent(t, tt.cfg, tt.script, tt.refused, tt.err)
		})
	}
}

// TestRateCancellationRefundsCost cancels queued callers of several costs,
// at the front and behind it, and wants the others to start as if the
// cancelled ones had never been there: each gave its whole cost back. (A
// cancelled front still holds back the callers behind it until it gives up,
// so each one here gives up before they could have started.)
func TestRateCancellationRefundsCost(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	tests := []struct {
		name      string
		cfg       RateConfig
		script    []arrival
		cancelled map[int]bool
	}{
		{
			name:      "the front",
			cfg:       RateConfig{Rate: 1, Burst: 4},
			script:    []arrival{{cost: 4}, {cost: 4, cancelAt: ms(500)}, {cost: 1}, {cost: 2}},
			cancelled: map[int]bool{1: true},
		},
		{
			name:      "behind the front",
			cfg:       RateConfig{Rate: 1, Burst: 4},
			script:    []arrival{{cost: 4}, {cost: 2}, {cost: 4, cancelAt: ms(1000)}, {cost: 1}, {at: ms(1500), cost: 3}},
			cancelled: map[int]bool{2: true},
		},
		{
			name: "several, the last first",
			cfg:  RateConfig{Rate: 1, Burst: 3},
			script: []arrival{
				{cost: 3}, {cost: 3, cancelAt: ms(900)}, {cost: 3, cancelAt: ms(950)},
				{cost: 2, cancelAt: ms(500)}, {cost: 1}, {cost: 3},
			},
			cancelled: map[int]bool{1: true, 2: true, 3: true},
		},
		{
			name:      "with MaxWait: the refund counts for later estimates",
			cfg:       RateConfig{Rate: 1, Burst: 4, MaxWait: 5 * time.Second},
			script:    []arrival{{cost: 4}, {cost: 4, cancelAt: ms(100)}, {at: ms(200), cost: 4}, {at: ms(300), cost: 1}},
			cancelled: map[int]bool{1: true},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkAsIfAbsent(t, tt.cfg, tt.script, tt.cancelled, context.DeadlineExceeded)
		})
	}
}

// checkAsIfAbsent plays script twice on a new Rate of cfg, with and without
// the callers in gone, and wants the others to return with nil at the same
// times, to the microsecond (a refund's float arithmetic may move the next
// booking by a nanosecond). Each caller in gone must return an error matching err: at its
// cancelAt if err is context.DeadlineExceeded, else at once.
func checkAsIfAbsent(t *testing.T, cfg RateConfig, script []arrival, gone map[int]bool, err error) {
	t.Helper()
	var base []arrival
	for i, a := range script {
		if !gone[i] {
			base = append(base, a)
		}
	}
	var plain, mixed []outcome
	synctest.Test(t, func(t *testing.T) {
		r, _ := NewRate(cfg)
		plain = play(t, r, base)
	})
	synctest.Test(t, func(t *testing.T) {
		r, _ := NewRate(cfg)
		mixed = play(t, r, script)
		if n := r.Waiting(); n != 0 {
			t.Errorf("Waiting() = %d after the script, want 0", n)
		}
	})
	j := 0
	for i, m := range mixed {
		if gone[i] {
			want := script[i].at
			if errors.Is(err, context.DeadlineExceeded) {
				want = script[i].cancelAt
			}
			if !errors.Is(m.err, err) || m.at != want {
				t.Errorf("caller %d: %v at %v, want %v at %v", i, m.err, m.at, err, want)
			}
			continue
		}
		if p := plain[j]; m.at.Round(time.Microsecond) != p.at.Round(time.Microsecond) || m.err != nil || p.err != nil {
			t.Errorf("caller %d: %v with the others around, %v without", i, m, p)
		}
		j++
	}
}

// TestRateWindowBound drives limiters with random arrivals, random costs and
// random cancellations, and checks every window: the costs started in any
// half-open window of length w stay below Burst + w*Rate/Period (Burst 0
// counting as 1). It also checks the limiter kept up with the demand.
func TestRateWindowBound(t *testing.T) {
	tests := []struct {
		cfg     RateConfig
		maxCost int // 1: Enter; more: EnterN with costs from 1 to maxCost
	}{
		{RateConfig{Rate: 1}, 1},
		{RateConfig{Rate: 3}, 1},
		{RateConfig{Rate: 7, Period: time.Second}, 1},
		{RateConfig{Rate: 1, Period: 3 * time.Second}, 1},
		{RateConfig{Rate: 10, Period: 7 * time.Millisecond}, 1},
		{RateConfig{Rate: 100, Burst: 5}, 1},
		{RateConfig{Rate: 33, Period: 333 * time.Microsecond, Burst: 2}, 1},
		{RateConfig{Rate: 13, Period: 1001 * time.Millisecond, MaxQueue: 3}, 1},
		{RateConfig{Rate: 100, Burst: 5}, 5},
		{RateConfig{Rate: 33, Period: 333 * time.Microsecond, Burst: 3}, 2},
		{RateConfig{Rate: 10, Burst: 10, MaxQueue: 3}, 7},
		{RateConfig{Rate: 13, Period: 1001 * time.Millisecond, Burst: 4, MaxWait: time.Second}, 4},
	}
	for i, tt := range tests {
		cfg := tt.cfg
		t.Run(fmt.Sprintf("%d per %v burst %d cost up to %d", cfg.Rate, cfg.Period, cfg.Burst, tt.maxCost), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r, err := NewRate(cfg)
				if err != nil {
					t.Fatal(err)
				}
				period := cmp(cfg.Period, time.Second)
				interval := period / time.Duration(cfg.Rate)
				run := 40 * period
				starts := drive(t, r, uint64(i), 8, run, interval, tt.maxCost)

				b := max(cfg.Burst, 1)
				for _, w := range []time.Duration{interval, period / 2, period, 3 * period, period + interval/2} {
					n := maxInWindow(starts, w)
					// n < b + w*Rate/period, in integers.
					if int64(n-b)*int64(period) >= int64(w)*int64(cfg.Rate) {
						t.Errorf("%d starts in a window of %v, more than %d + %v*%d/%v allows", n, w, b, w, cfg.Rate, period)
					}
				}
				ideal := float64(run) / float64(period) * float64(cfg.Rate)
				if got := float64(len(starts)); got < 0.95*ideal {
					t.Errorf("%v starts in %v, want about %.0f: the limiter fell behind", got, run, ideal)
				}
				if n := r.Waiting(); n != 0 {
					t.Errorf("Waiting() = %d after the run, want 0", n)
				}
			})
		})
	}
}

func cmp(d, zero time.Duration) time.Duration {
	if d == 0 {
		return zero
	}
	return d
}

// drive runs workers that call Enter back to back with short random pauses
// for run, a quarter of them with a deadline that may cut the wait short.
// With maxCost above 1 they call EnterN with random costs from 1 to maxCost
// instead. It returns the start times, a start of cost n counted n times.
// Must run in a synctest bubble.
func drive(t *testing.T, lim enterer, seed uint64, workers int, run, interval time.Duration, maxCost int) []time.Time {
	t.Helper()
	end := time.Now().Add(run)
	var (
		mu     sync.Mutex
		starts []time.Time
		wg     sync.WaitGroup
	)
	for w := range workers {
		rng := rand.New(rand.NewPCG(seed, uint64(w)))
		pause := func() time.Duration { return time.Duration(rng.Int64N(int64(interval)/2 + 1)) }
		wg.Go(func() {
			for time.Now().Before(end) {
				time.Sleep(pause())
				ctx, cancel := context.WithDeadline(context.Background(), end)
				if rng.IntN(4) == 0 {
					ctx, cancel = context.WithTimeout(ctx, 4*pause())
				}
				a := arrival{}
				if maxCost > 1 {
					a.cost = 1 + rng.IntN(maxCost)
				}
				err := a.enter(ctx, lim)
				cancel()
				switch {
				case err == nil:
					mu.Lock()
					for range max(a.cost, 1) {
						starts = append(starts, time.Now())
					}
					mu.Unlock()
				case errors.Is(err, context.DeadlineExceeded), errors.Is(err, sluice.ErrLimited):
				default:
					t.Errorf("Enter: %v", err)
				}
			}
		})
	}
	wg.Wait()
	return starts
}

// TestRateCancellationStorm queues many callers, cancels most of them at
// random moments in random order, and wants the rest to start back to back
// (no hole left by any cancelled caller, whatever its cost), the queue
// counter back at zero, and a full queue available again.
//
// Back to back means: each caller that got through started as soon as both
// the rate had paid for its cost and those of the callers before it that got
// through (less the Burst spent at once), and every caller ahead of it had
// left the queue, started or given up. (A cheap caller behind a costly one
// may wait for the costly one to give up though the tokens it needs are
// there: callers never overtake.)
func TestRateCancellationStorm(t *testing.T) {
	for _, maxCost := range []int{1, 5} {
		t.Run(fmt.Sprintf("cost up to %d", maxCost), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const callers = 300
				r, err := NewRate(RateConfig{Rate: 10, Burst: maxCost, MaxQueue: callers})
				if err != nil {
					t.Fatal(err)
				}
				rng := rand.New(rand.NewPCG(1, uint64(maxCost)))
				t0 := time.Now()
				var (
					wg        sync.WaitGroup
					mu        sync.Mutex
					ends      = make([]time.Duration, callers) // when each returned
					started   = make([]bool, callers)
					costs     = make([]int, callers)
					cancelled int
				)
				for i := range callers {
					ctx, cancel := context.WithCancel(context.Background())
					if rng.IntN(5) != 0 {
						time.AfterFunc(time.Duration(rng.Int64N(int64(5*time.Second))), cancel)
					}
					a := arrival{}
					if maxCost > 1 {
						a.cost = 1 + rng.IntN(maxCost)
					}
					costs[i] = max(a.cost, 1)
					wg.Go(func() {
						defer cancel()
						err := a.enter(ctx, r)
						mu.Lock()
						defer mu.Unlock()
						ends[i] = time.Since(t0)
						switch {
						case err == nil:
							started[i] = true
						case errors.Is(err, context.Canceled):
							cancelled++
						default:
							t.Errorf("Enter: %v", err)
						}
					})
					synctest.Wait() // queued in index order
				}
				wg.Wait()
				if cancelled == 0 || cancelled == callers {
					t.Fatalf("%d of %d cancelled: the storm did not happen", cancelled, callers)
				}
				interval := 100*time.Millisecond + roundingGuard
				var (
					paid  int           // the costs of the callers that started, up to this one
					ahead time.Duration // when the last caller ahead left the queue
				)
				for i, at := range ends {
					if started[i] {
						paid += costs[i]
						want := max(time.Duration(max(paid-maxCost, 0))*interval, ahead)
						if d := at - want; d < -time.Microsecond || d > time.Microsecond {
							t.Fatalf("caller %d (cost %d) started at %v, want %v: a cancelled caller left a hole", i, costs[i], at, want)
						}
					}
					ahead = max(ahead, at)
				}
				if n := r.Waiting(); n != 0 {
					t.Fatalf("Waiting() = %d after the storm, want 0", n)
				}
				// The counter did not leak: a full queue is accepted again.
				got := play(t, r, make([]arrival, callers+1))
				if !errors.Is(got[callers].err, sluice.ErrQueueFull) {
					t.Errorf("caller %d after the storm: %v, want sluice.ErrQueueFull", callers, got[callers].err)
				}
				for i, o := range got[:callers] {
					if o.err != nil {
						t.Fatalf("caller %d after the storm refused: %v", i, o.err)
					}
				}
			})
		})
	}
}

func TestRateDo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r, _ := NewRate(RateConfig{Rate: 1, MaxQueue: 1})
		boom := errors.New("boom")
		if err := r.Do(context.Background(), func(context.Context) error { return boom }); err != boom {
			t.Fatalf("Do returned %v, want fn's error", err)
		}
		ran := false
		var wg sync.WaitGroup
		defer wg.Wait()
		wg.Go(func() { r.Enter(context.Background()) }) // fills the queue
		synctest.Wait()
		err := r.Do(context.Background(), func(context.Context) error { ran = true; return nil })
		if !errors.Is(err, sluice.ErrQueueFull) || !errors.Is(err, sluice.ErrLimited) || ran {
			t.Fatalf("Do on a full queue: err %v, ran %v; want sluice.ErrQueueFull and fn not run", err, ran)
		}
	})
}

// TestRateBurstAtOnce starts more callers than the burst at the same
// instant, all at once from their own goroutines, and wants exactly Burst of
// them through (1 for Burst 0), as many as x/time/rate lets through with the
// same burst, and one more each interval after that.
func TestRateBurstAtOnce(t *testing.T) {
	for _, burst := range []int{0, 1, 2, 5, 100} {
		t.Run(fmt.Sprintf("burst %d", burst), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r, err := NewRate(RateConfig{Rate: 1, Burst: burst})
				if err != nil {
					t.Fatal(err)
				}
				want := max(burst, 1)
				callers := want + 3
				raw := rate.NewLimiter(1, want)
				now, allowed := time.Now(), 0
				for range callers {
					if raw.AllowN(now, 1) {
						allowed++
					}
				}
				if allowed != want {
					t.Fatalf("x/time/rate with burst %d let %d through, the test expects %d", want, allowed, want)
				}

				var done atomic.Int64
				var wg sync.WaitGroup
				for range callers {
					wg.Go(func() {
						if err := r.Enter(context.Background()); err != nil {
							t.Errorf("Enter: %v", err)
						}
						done.Add(1)
					})
				}
				synctest.Wait()
				if n := done.Load(); n != int64(want) {
					t.Errorf("Burst %d: %d of %d callers started at once, want %d", burst, n, callers, want)
				}
				for i := range 3 {
					time.Sleep(time.Second + roundingGuard)
					synctest.Wait()
					if n, w := done.Load(), int64(want+i+1); n != w {
						t.Errorf("after %d intervals %d started, want %d", i+1, n, w)
					}
				}
				wg.Wait()
			})
		})
	}
}

// TestRateEnterNCosts checks the costs that never wait: zero (at once, even
// behind a full queue), negative and above the burst (refused at once with
// errors that are not refusals), and Burst itself (accepted).
func TestRateEnterNCosts(t *testing.T) {
	live := context.Background()
	dead, cancel := context.WithCancel(live)
	cancel()
	tests := []costCase{
		{name: "zero", ctx: live, n: 0},
		{name: "zero with an ended context", ctx: dead, n: 0, wantErr: context.Canceled},
		{name: "negative", ctx: live, n: -1, bad: true, words: "negative cost -1"},
		{name: "very negative", ctx: live, n: math.MinInt, bad: true, words: "negative cost"},
		{name: "just above the burst", ctx: live, n: 4, wantErr: sluice.ErrCostExceedsCapacity, words: "cost 4 above the Burst 3"},
		{name: "far above the burst", ctx: live, n: math.MaxInt, wantErr: sluice.ErrCostExceedsCapacity, words: "above the Burst 3"},
		{name: "above the burst with an ended context", ctx: dead, n: 4, wantErr: sluice.ErrCostExceedsCapacity},
		{name: "the burst itself, behind a full queue", ctx: live, n: 3, wantErr: sluice.ErrQueueFull},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r, _ := NewRate(RateConfig{Rate: 1, Burst: 3, MaxQueue: 1})
				if err := r.EnterN(live, 3); err != nil {
					t.Fatal(err)
				}
				var wg sync.WaitGroup
				defer wg.Wait()
				wg.Go(func() { r.Enter(live) }) // fills the queue
				synctest.Wait()

				t0 := time.Now()
				err := r.EnterN(tt.ctx, tt.n)
				if time.Since(t0) != 0 {
					t.Errorf("EnterN(%d) took %v, want an answer at once", tt.n, time.Since(t0))
				}
				checkCostAnswer(t, fmt.Sprintf("EnterN(%d)", tt.n), err, tt.bad, tt.wantErr, tt.words)
				if n := r.Waiting(); n != 1 {
					t.Errorf("Waiting() = %d after EnterN(%d), want the 1 queued before", n, tt.n)
				}
			})
		})
	}
}

// TestRateFIFOAcrossCosts plays random arrivals with random costs and
// compares every start with a token bucket worked out by hand: callers start
// in arrival order, each as soon as it is at the front and the bucket holds
// its cost. A cheap caller never overtakes a costly one waiting ahead of it.
func TestRateFIFOAcrossCosts(t *testing.T) {
	tests := []struct {
		cfg     RateConfig
		maxCost int
	}{
		{RateConfig{Rate: 10, Burst: 5}, 5},
		{RateConfig{Rate: 3, Period: 2 * time.Second, Burst: 8}, 8},
		{RateConfig{Rate: 100, Burst: 20}, 3},
	}
	for i, tt := range tests {
		t.Run(fmt.Sprintf("%d per %v burst %d", tt.cfg.Rate, tt.cfg.Period, tt.cfg.Burst), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, uint64(i)))
			period := cmp(tt.cfg.Period, time.Second)
			interval := period/time.Duration(tt.cfg.Rate) + roundingGuard
			script := make([]arrival, 200)
			var at time.Duration
			for k := range script {
				// Mostly faster than the rate, with idle spells that refill
				// the bucket.
				at += time.Duration(rng.Int64N(int64(interval)))
				if rng.IntN(20) == 0 {
					at += time.Duration(tt.cfg.Burst) * interval
				}
				script[k] = arrival{at: at, cost: 1 + rng.IntN(tt.maxCost)}
			}
			var got []outcome
			synctest.Test(t, func(t *testing.T) {
				r, _ := NewRate(tt.cfg)
				got = play(t, r, script)
			})

			// The model: tokens refill continuously, one per interval, up
			// to Burst.
			perToken := float64(interval)
			tokens, last := float64(tt.cfg.Burst), time.Duration(0)
			var prev time.Duration
			for k, a := range script {
				front := max(a.at, prev) // when k is first in line
				tokens = min(float64(tt.cfg.Burst), tokens+float64(front-last)/perToken)
				start := front
				if need := float64(a.cost) - tokens; need > 0 {
					start += time.Duration(need * perToken)
				}
				tokens += float64(start-front)/perToken - float64(a.cost)
				last, prev = start, start

				g := got[k]
				if g.err != nil {
					t.Fatalf("caller %d (cost %d): %v", k, a.cost, g.err)
				}
				if d := g.at - start; d < -time.Microsecond || d > time.Microsecond {
					t.Fatalf("caller %d (cost %d, arrived %v) started at %v, want %v", k, a.cost, a.at, g.at, start)
				}
				if k > 0 && g.at < got[k-1].at {
					t.Fatalf("caller %d (cost %d) started at %v, before caller %d at %v: it overtook", k, a.cost, g.at, k-1, got[k-1].at)
				}
			}
		})
	}
}
