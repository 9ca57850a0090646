package local

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"testing/synctest"
	"time"
)

func TestNewSpacerValidates(t *testing.T) {
	tests := []struct {
		cfg SpacerConfig
		ok  bool
	}{
		{SpacerConfig{Space: time.Millisecond}, true},
		{SpacerConfig{Space: time.Second, Align: true}, true},
		{SpacerConfig{}, false},
		{SpacerConfig{Space: -time.Second, Align: true}, false},
	}
	for _, tt := range tests {
		s, err := NewSpacer(tt.cfg)
		if tt.ok != (err == nil) || tt.ok != (s != nil) || (!tt.ok && !errors.Is(err, errConfig)) {
			t.Errorf("NewSpacer(%+v) = %v, %v; want ok %v", tt.cfg, s, err, tt.ok)
		}
	}
}

func TestSpacerScript(t *testing.T) {
	const s = time.Second
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	tests := []struct {
		name   string
		cfg    SpacerConfig
		script []arrival
		want   []outcome
	}{
		{
			name:   "spaced in arrival order",
			cfg:    SpacerConfig{Space: s},
			script: []arrival{{}, {}, {}},
			want:   []outcome{{0, nil}, {s, nil}, {2 * s, nil}},
		},
		{
			name:   "idle time is not saved up",
			cfg:    SpacerConfig{Space: s},
			script: []arrival{{}, {at: ms(3500)}, {at: ms(3500)}},
			want:   []outcome{{0, nil}, {ms(3500), nil}, {ms(4500), nil}},
		},
		{
			name:   "align rounds up to a multiple",
			cfg:    SpacerConfig{Space: s, Align: true},
			script: []arrival{{at: ms(300)}, {at: ms(300)}, {at: ms(2200)}, {at: ms(2900)}},
			want:   []outcome{{s, nil}, {2 * s, nil}, {3 * s, nil}, {4 * s, nil}},
		},
		{
			name: "align keeps the minimum spacing",
			cfg:  SpacerConfig{Space: s, Align: true},
			// The second caller is nearest to the 1 s mark and past the
			// 0 s one, yet must not start before 1 s.
			script: []arrival{{}, {at: ms(900)}, {at: ms(1100)}},
			want:   []outcome{{0, nil}, {s, nil}, {2 * s, nil}},
		},
		{
			name:   "a cancelled sleeper gives back its slot",
			cfg:    SpacerConfig{Space: s, Align: true},
			script: []arrival{{}, {cancelAt: ms(500)}, {}},
			want:   []outcome{{0, nil}, {ms(500), context.DeadlineExceeded}, {s, nil}},
		},
		{
			name:   "a cancelled waiter in the middle leaves no hole",
			cfg:    SpacerConfig{Space: s},
			script: []arrival{{}, {}, {cancelAt: ms(1500)}, {}},
			want:   []outcome{{0, nil}, {s, nil}, {ms(1500), context.DeadlineExceeded}, {2 * s, nil}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				// The bubble's clock starts at midnight UTC, a multiple
				// of every Space used here.
				sp, err := NewSpacer(tt.cfg)
				if err != nil {
					t.Fatal(err)
				}
				checkOutcomes(t, play(t, sp, tt.script), tt.want)
				if n := sp.Waiting(); n != 0 {
					t.Errorf("Waiting() = %d after the script, want 0", n)
				}
			})
		})
	}
}

// TestSpacerInvariant drives spacers with random arrivals and cancellations
// and checks every pair of consecutive starts is at least Space apart, and
// with Align that every start is on a multiple of Space.
func TestSpacerInvariant(t *testing.T) {
	tests := []SpacerConfig{
		{Space: time.Second},
		{Space: 7 * time.Millisecond},
		{Space: time.Second, Align: true},
		{Space: 333 * time.Microsecond, Align: true},
		{Space: 3 * time.Second, Align: true},
	}
	for i, cfg := range tests {
		t.Run(fmt.Sprintf("%v align %v", cfg.Space, cfg.Align), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				// Start off any multiple, so alignment has work to do.
				time.Sleep(cfg.Space/3 + 1)
				sp, err := NewSpacer(cfg)
				if err != nil {
					t.Fatal(err)
				}
				run := 50 * cfg.Space
				starts := drive(t, sp, uint64(i), 6, run, cfg.Space, 1)
				if len(starts) < 40 {
					t.Fatalf("%d starts in %v: the spacer fell behind", len(starts), run)
				}
				if n := maxInWindow(starts, cfg.Space); n > 1 {
					t.Errorf("%d starts within %v", n, cfg.Space)
				}
				for _, at := range starts {
					if cfg.Align && !at.Truncate(cfg.Space).Equal(at) {
						t.Errorf("start at %v is not on a multiple of %v", at, cfg.Space)
					}
				}
				if n := sp.Waiting(); n != 0 {
					t.Errorf("Waiting() = %d after the run, want 0", n)
				}
			})
		})
	}
}

func TestSpacerDo(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sp, _ := NewSpacer(SpacerConfig{Space: time.Second})
		var at []time.Time
		for range 3 {
			err := sp.Do(context.Background(), func(context.Context) error {
				at = append(at, time.Now())
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		}
		if len(at) != 3 || at[2].Sub(at[0]) != 2*time.Second {
			t.Fatalf("Do ran fn at %v, want three runs 1 s apart", at)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := sp.Do(ctx, func(context.Context) error { return nil }); !errors.Is(err, context.Canceled) {
			t.Fatalf("Do with a cancelled context: %v", err)
		}
	})
}
