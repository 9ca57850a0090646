package bucket

import (
	"math"
	"testing"
	"time"

	"github.com/sluicehq/sluice/upstream"
)

// What a refusal's quotas say: the rate Adapt steps to, and how long the
// refusal holds.
func TestAdaptSaid(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	// OpenAI's requests: 20 at most, refilled all along.
	openai := func(rem int64, reset time.Duration) upstream.Quota {
		return upstream.Quota{Limit: 20, Remaining: rem, Reset: reset, UntilFull: true}
	}
	calls := []Policy{{Capacity: 20, RefillAmount: 1, RefillFrequency: 8 * time.Millisecond}} // 125 a second
	tokens := []Policy{calls[0], {Unit: "tokens", Capacity: 10000, RefillAmount: 1000, RefillFrequency: time.Second}}
	tests := []struct {
		name   string
		s      upstream.Signal
		policy []Policy
		factor float64       // saidFactor; 0: none said
		hold   time.Duration // refusalHold
	}{
		{
			// 19 of 20 (one less, Remaining being rounded down) refill
			// in 200 ms: 95 a second of the 125 configured; one is back
			// in 10 ms, not the second Retry-After rounds up to.
			name:   "until full, exhausted",
			s:      upstream.Signal{Status: 429, Refused: true, RetryAfter: time.Second, Quotas: []upstream.Quota{openai(0, ms(200))}},
			policy: calls,
			factor: 95.0 / 125, hold: ms(10),
		},
		{
			name: "a window: Limit over Window",
			s: upstream.Signal{Status: 429, Refused: true, RetryAfter: time.Second,
				Quotas: []upstream.Quota{{Limit: 100, Remaining: 0, Reset: ms(300), Window: time.Second}}},
			policy: calls,
			factor: 100.0 / 125, hold: ms(300),
		},
		{
			name:   "no reset: nothing said, the whole Retry-After",
			s:      upstream.Signal{Status: 429, Refused: true, RetryAfter: time.Second, Quotas: []upstream.Quota{{Limit: 20, Remaining: 0}}},
			policy: calls,
			factor: 0, hold: time.Second,
		},
		{
			// A Retry-After longer than rounding explains is the
			// upstream's word.
			name:   "a longer Retry-After holds in full",
			s:      upstream.Signal{Status: 429, Refused: true, RetryAfter: 5 * time.Second, Quotas: []upstream.Quota{openai(0, ms(200))}},
			policy: calls,
			factor: 95.0 / 125, hold: 5 * time.Second,
		},
		{
			name:   "a Retry-After not in whole seconds holds in full",
			s:      upstream.Signal{Status: 429, Refused: true, RetryAfter: ms(1500), Quotas: []upstream.Quota{openai(0, ms(200))}},
			policy: calls,
			factor: 95.0 / 125, hold: ms(1500),
		},
		{
			// A quota with some left did not refuse: it says nothing of
			// the refusal, and it cannot shorten the hold.
			name:   "a quota not exhausted says nothing",
			s:      upstream.Signal{Status: 429, Refused: true, RetryAfter: time.Second, Quotas: []upstream.Quota{openai(5, ms(150))}},
			policy: calls,
			factor: 0, hold: time.Second,
		},
		{
			// Tokens exhausted: their rate; a request needs more than
			// one token, so the hold lasts until the tokens are full.
			name: "tokens exhausted, calls left",
			s: upstream.Signal{Status: 429, Refused: true, RetryAfter: time.Second, Quotas: []upstream.Quota{
				openai(15, ms(50)),
				{Unit: "tokens", Limit: 10000, Remaining: 0, Reset: ms(800), UntilFull: true}}},
			policy: tokens,
			factor: 9999.0 / 0.8 / 1000, hold: ms(800),
		},
		{
			// Of two exhausted quotas the slower says the rate, and the
			// later one the hold.
			name: "the least rate, the latest return",
			s: upstream.Signal{Status: 429, Refused: true, RetryAfter: time.Second, Quotas: []upstream.Quota{
				openai(0, ms(400)),
				{Unit: "tokens", Limit: 10000, Remaining: 0, Reset: ms(900), UntilFull: true}}},
			policy: tokens,
			factor: 19.0 / 0.4 / 125, hold: ms(900),
		},
		{
			name:   "no Retry-After: no hold",
			s:      upstream.Signal{Status: 429, Refused: true, Quotas: []upstream.Quota{openai(0, ms(200))}},
			policy: calls,
			factor: 95.0 / 125, hold: 0,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := saidFactor(tt.s.Quotas, tt.policy); math.Abs(got-tt.factor) > 1e-9 {
				t.Errorf("saidFactor = %v, want %v", got, tt.factor)
			}
			if got := refusalHold(tt.s); got != tt.hold {
				t.Errorf("refusalHold = %v, want %v", got, tt.hold)
			}
		})
	}
}
