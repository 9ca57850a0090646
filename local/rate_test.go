package local

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

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
		{"burst overflows", RateConfig{Rate: 1, Burst: math.MaxInt}, false},
		{"negative max queue", RateConfig{Rate: 1, MaxQueue: -1}, false},
		{"negative max wait", RateConfig{Rate: 1, MaxWait: -time.Second}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := NewRate(tt.cfg)
			if tt.ok && (err != nil || r == nil) {
				t.Fatalf("NewRate(%+v) = %v, %v; want a limiter", tt.cfg, r, err)
			}
			if !tt.ok && (!errors.Is(err, ErrConfig) || r != nil) {
				t.Fatalf("NewRate(%+v) = %v, %v; want ErrConfig", tt.cfg, r, err)
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
			cfg:    RateConfig{Rate: 1, Burst: 2},
			script: []arrival{{}, {}, {}, {}},
			want:   []outcome{{0, nil}, {0, nil}, {0, nil}, {s, nil}},
		},
		{
			name:   "burst is regained from idle time only",
			cfg:    RateConfig{Rate: 1, Burst: 1},
			script: []arrival{{}, {}, {}, {at: 10 * s}, {at: 10 * s}, {at: 10 * s}},
			want:   []outcome{{0, nil}, {0, nil}, {s, nil}, {10 * s, nil}, {10 * s, nil}, {11 * s, nil}},
		},
		{
			name:   "max queue refuses at once",
			cfg:    RateConfig{Rate: 1, MaxQueue: 2},
			script: []arrival{{}, {}, {}, {}, {at: ms(1500)}},
			want:   []outcome{{0, nil}, {s, nil}, {2 * s, nil}, {0, ErrQueueFull}, {3 * s, nil}},
		},
		{
			name:   "max wait counts the sleeper's remaining time",
			cfg:    RateConfig{Rate: 1, MaxWait: ms(1500)},
			script: []arrival{{}, {}, {at: ms(450)}, {at: ms(550)}},
			// At 450 ms the second caller still sleeps 550 ms, so the third
			// would wait 550+1000 ms; at 550 ms, 450+1000 ms.
			want: []outcome{{0, nil}, {s, nil}, {ms(450), ErrWaitTooLong}, {2 * s, nil}},
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
			err:     ErrQueueFull,
		},
		{
			name:    "wait too long",
			cfg:     RateConfig{Rate: 1, MaxWait: ms(1500)},
			script:  []arrival{{}, {}, {}, {at: ms(600)}, {at: ms(600)}, {at: ms(2100)}, {at: ms(2100)}},
			refused: map[int]bool{2: true, 4: true, 6: true},
			err:     ErrWaitTooLong,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var base []arrival
			for i, a := range tt.script {
				if !tt.refused[i] {
					base = append(base, a)
				}
			}
			var plain, mixed []outcome
			synctest.Test(t, func(t *testing.T) {
				r, _ := NewRate(tt.cfg)
				plain = play(t, r, base)
			})
			synctest.Test(t, func(t *testing.T) {
				r, _ := NewRate(tt.cfg)
				mixed = play(t, r, tt.script)
			})
			j := 0
			for i, m := range mixed {
				if tt.refused[i] {
					if !errors.Is(m.err, tt.err) || m.at != tt.script[i].at {
						t.Errorf("caller %d: %v at %v, want %v at once", i, m.err, m.at, tt.err)
					}
					continue
				}
				if p := plain[j]; m != p || p.err != nil {
					t.Errorf("caller %d: %v with refusals around, %v without", i, m, p)
				}
				j++
			}
		})
	}
}

// TestRateWindowBound drives limiters with random arrivals and random
// cancellations, and checks every window: starts in any half-open window of
// length w stay below 1 + Burst + w*Rate/Period. It also checks the limiter
// kept up with the demand.
func TestRateWindowBound(t *testing.T) {
	tests := []RateConfig{
		{Rate: 1},
		{Rate: 3},
		{Rate: 7, Period: time.Second},
		{Rate: 1, Period: 3 * time.Second},
		{Rate: 10, Period: 7 * time.Millisecond},
		{Rate: 100, Burst: 5},
		{Rate: 33, Period: 333 * time.Microsecond, Burst: 2},
		{Rate: 13, Period: 1001 * time.Millisecond, MaxQueue: 3},
	}
	for i, cfg := range tests {
		t.Run(fmt.Sprintf("%d per %v burst %d", cfg.Rate, cfg.Period, cfg.Burst), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r, err := NewRate(cfg)
				if err != nil {
					t.Fatal(err)
				}
				period := cmp(cfg.Period, time.Second)
				interval := period / time.Duration(cfg.Rate)
				run := 40 * period
				starts := drive(t, r, uint64(i), 8, run, interval)

				b := 1 + cfg.Burst
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
// for run, a quarter of them with a deadline that may cut the wait short. It
// returns the start times. Must run in a synctest bubble.
func drive(t *testing.T, lim enterer, seed uint64, workers int, run, interval time.Duration) []time.Time {
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
				err := lim.Enter(ctx)
				cancel()
				switch {
				case err == nil:
					mu.Lock()
					starts = append(starts, time.Now())
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
// (no hole left by any cancelled caller), the queue counter back at zero, and
// a full queue available again.
func TestRateCancellationStorm(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const callers = 300
		r, err := NewRate(RateConfig{Rate: 10, MaxQueue: callers})
		if err != nil {
			t.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(1, 2))
		t0 := time.Now()
		var (
			wg        sync.WaitGroup
			mu        sync.Mutex
			starts    []time.Duration
			cancelled int
		)
		for range callers {
			ctx, cancel := context.WithCancel(context.Background())
			keep := rng.IntN(5) == 0
			if !keep {
				time.AfterFunc(time.Duration(rng.Int64N(int64(5*time.Second))), cancel)
			}
			wg.Go(func() {
				defer cancel()
				err := r.Enter(ctx)
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					starts = append(starts, time.Since(t0))
				case errors.Is(err, context.Canceled):
					cancelled++
				default:
					t.Errorf("Enter: %v", err)
				}
			})
			synctest.Wait()
		}
		wg.Wait()
		if cancelled == 0 || len(starts) == 0 {
			t.Fatalf("%d started, %d cancelled: the storm did not happen", len(starts), cancelled)
		}
		for i, at := range starts {
			want := time.Duration(i) * 100 * time.Millisecond
			if at.Round(time.Microsecond) != want {
				t.Fatalf("start %d at %v, want %v: a cancelled caller left a hole", i, at, want)
			}
		}
		if n := r.Waiting(); n != 0 {
			t.Fatalf("Waiting() = %d after the storm, want 0", n)
		}
		// The counter did not leak: a full queue is accepted again.
		got := play(t, r, make([]arrival, callers+1))
		if !errors.Is(got[callers].err, ErrQueueFull) {
			t.Errorf("caller %d after the storm: %v, want ErrQueueFull", callers, got[callers].err)
		}
		for i, o := range got[:callers] {
			if o.err != nil {
				t.Fatalf("caller %d after the storm refused: %v", i, o.err)
			}
		}
	})
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
		if !errors.Is(err, ErrQueueFull) || !errors.Is(err, sluice.ErrLimited) || ran {
			t.Fatalf("Do on a full queue: err %v, ran %v; want ErrQueueFull and fn not run", err, ran)
		}
	})
}
