package local

import (
	"context"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/upstream"
)

// feedback is a Signal fed to a Rate at offset at of a script.
type feedback struct {
	at time.Duration
	s  upstream.Signal
}

// playWith plays script on lim while feeding it signals, inside a synctest
// bubble. No signal may share an instant with an arrival.
func playWith(t *testing.T, lim *Rate, script []arrival, signals []feedback) []outcome {
	t.Helper()
	t0 := time.Now()
	var wg sync.WaitGroup
	wg.Go(func() {
		for _, f := range signals {
			time.Sleep(time.Until(t0.Add(f.at)))
			if err := lim.Feedback(context.Background(), f.s); err != nil {
				t.Errorf("Feedback: %v", err)
			}
		}
	})
	out := play(t, lim, script)
	wg.Wait()
	return out
}

func TestRateFeedback(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	hold := func(at, d time.Duration) feedback {
		return feedback{at, upstream.Signal{Status: 429, Refused: true, RetryAfter: d}}
	}
	quota := func(at time.Duration, q ...upstream.Quota) feedback {
		return feedback{at, upstream.Signal{Status: 200, Quotas: q}}
	}
	tests := []struct {
		name    string
		cfg     RateConfig
		script  []arrival
		signals []feedback
		want    []outcome
	}{
		{
			// B holds the front's booking (100 ms) when the hold comes at
			// 50 ms: it books again after the hold, and C and D follow at
			// the rate, not all at once.
			name:    "hold re-times the queue",
			cfg:     RateConfig{Rate: 10},
			script:  []arrival{{}, {}, {}, {}},
			signals: []feedback{hold(ms(50), time.Second)},
			want:    []outcome{{0, nil}, {ms(1050), nil}, {ms(1150), nil}, {ms(1250), nil}},
		},
		{
			// Empty at the hold's start, refilled during it: Burst 3 lets
			// 3 start when it ends, then the rate.
			name:    "hold with a burst",
			cfg:     RateConfig{Rate: 10, Burst: 3},
			script:  []arrival{{at: ms(100)}, {at: ms(100)}, {at: ms(100)}, {at: ms(100)}},
			signals: []feedback{hold(ms(10), time.Second)},
			want:    []outcome{{ms(1010), nil}, {ms(1010), nil}, {ms(1010), nil}, {ms(1110), nil}},
		},
		{
			name:    "a shorter hold does not shorten a longer one",
			cfg:     RateConfig{Rate: 10},
			script:  []arrival{{at: ms(300)}},
			signals: []feedback{hold(ms(10), time.Second), hold(ms(20), ms(100))},
			want:    []outcome{{ms(1010), nil}},
		},
		{
			name:    "a longer hold during one extends it",
			cfg:     RateConfig{Rate: 10},
			script:  []arrival{{at: ms(600)}, {at: ms(600)}},
			signals: []feedback{hold(ms(10), time.Second), hold(ms(500), 2*time.Second)},
			want:    []outcome{{ms(2500), nil}, {ms(2600), nil}},
		},
		{
			name:    "a refusal without Retry-After changes nothing",
			cfg:     RateConfig{Rate: 10},
			script:  []arrival{{at: ms(100)}, {at: ms(100)}},
			signals: []feedback{{ms(10), upstream.Signal{Status: 429, Refused: true}}},
			want:    []outcome{{ms(100), nil}, {ms(200), nil}},
		},
		{
			// The limiter thinks it is full (5); the upstream says 2 left
			// at 10 ms. At 100 ms 2.9 tokens are there: 2 start, the
			// third when the next is whole.
			name:    "sync lowers the tokens",
			cfg:     RateConfig{Rate: 10, Burst: 5},
			script:  []arrival{{at: ms(100)}, {at: ms(100)}, {at: ms(100)}},
			signals: []feedback{quota(ms(10), upstream.Quota{Limit: -1, Remaining: 2})},
			want:    []outcome{{ms(100), nil}, {ms(100), nil}, {ms(110), nil}},
		},
		{
			name:   "sync never raises, and ignores other units",
			cfg:    RateConfig{Rate: 10, Burst: 2},
			script: []arrival{{at: ms(1)}, {at: ms(1)}, {at: ms(100)}, {at: ms(100)}},
			signals: []feedback{quota(ms(50),
				upstream.Quota{Limit: -1, Remaining: 100},
				upstream.Quota{Unit: "pu", Limit: -1, Remaining: 0, Reset: time.Hour})},
			want: []outcome{{ms(1), nil}, {ms(1), nil}, {ms(101), nil}, {ms(201), nil}},
		},
		{
			// The upstream reports none left while the limiter is full:
			// the next start waits for the reported reset, and refills
			// resume from empty then.
			name:    "remaining 0 waits for the reset",
			cfg:     RateConfig{Rate: 10, Burst: 5},
			script:  []arrival{{at: ms(100)}, {at: ms(100)}},
			signals: []feedback{quota(ms(10), upstream.Quota{Limit: 5, Remaining: 0, Reset: 2 * time.Second})},
			want:    []outcome{{ms(2110), nil}, {ms(2210), nil}},
		},
		{
			// The same answer from an upstream whose reset is the time
			// until full (OpenAI, Anthropic): the bucket is empty at
			// once, and refills go on at the rate, not after the 2 s.
			name:    "remaining 0 of an until-full quota refills at the rate",
			cfg:     RateConfig{Rate: 10, Burst: 5},
			script:  []arrival{{at: ms(100)}, {at: ms(100)}},
			signals: []feedback{quota(ms(10), upstream.Quota{Limit: 5, Remaining: 0, Reset: 2 * time.Second, UntilFull: true})},
			want:    []outcome{{ms(110), nil}, {ms(210), nil}},
		},
		{
			name:    "a caller that gives up during a hold leaves no hole",
			cfg:     RateConfig{Rate: 10},
			script:  []arrival{{}, {}, {cancelAt: ms(500)}, {}},
			signals: []feedback{hold(ms(50), time.Second)},
			want:    []outcome{{0, nil}, {ms(1050), nil}, {ms(500), context.DeadlineExceeded}, {ms(1150), nil}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				lim, err := NewRate(tt.cfg)
				if err != nil {
					t.Fatal(err)
				}
				checkOutcomes(t, playWith(t, lim, tt.script, tt.signals), tt.want)
			})
		})
	}
}

// Random arrivals, costs, cancellations and holds: nobody starts during a
// hold (but a caller already due when it came), and the window bound
// holds throughout, since feedback only ever takes tokens away.
func TestRateFeedbackInvariant(t *testing.T) {
	for seed := range uint64(20) {
		synctest.Test(t, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 13))
			const period = time.Second
			rate := 1 + rng.IntN(20)
			lim, err := NewRate(RateConfig{Rate: rate, Period: period})
			if err != nil {
				t.Fatal(err)
			}
			t0 := time.Now()
			type span struct{ from, to time.Time }
			var (
				mu     sync.Mutex
				starts []time.Time
				holds  []span
				wg     sync.WaitGroup
			)
			wg.Go(func() {
				for range 5 {
					time.Sleep(time.Duration(rng.IntN(2000)) * time.Millisecond)
					d := time.Duration(1+rng.IntN(1500)) * time.Millisecond
					now := time.Now()
					lim.Feedback(context.Background(), upstream.Signal{Status: 429, Refused: true, RetryAfter: d})
					mu.Lock()
					holds = append(holds, span{now, now.Add(d)})
					mu.Unlock()
				}
			})
			for i := range 4 {
				r := rand.New(rand.NewPCG(seed, uint64(i)))
				wg.Go(func() {
					for time.Since(t0) < 10*time.Second {
						ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+r.IntN(3000))*time.Millisecond)
						if lim.Enter(ctx) == nil {
							mu.Lock()
							starts = append(starts, time.Now())
							mu.Unlock()
						}
						cancel()
						time.Sleep(time.Duration(r.IntN(200)) * time.Millisecond)
					}
				})
			}
			wg.Wait()
			for _, h := range holds {
				for _, s := range starts {
					if s.After(h.from) && s.Before(h.to) {
						t.Errorf("seed %d: a start at %v, inside the hold [%v, %v)", seed, s.Sub(t0), h.from.Sub(t0), h.to.Sub(t0))
					}
				}
			}
			if got := maxInWindow(starts, period); got > rate {
				t.Errorf("seed %d: %d starts in one period, want at most %d", seed, got, rate)
			}
			if len(starts) < 3 {
				t.Errorf("seed %d: only %d starts", seed, len(starts))
			}
		})
	}
}
