package local

import (
	"context"
	"errors"
	"math"
	"testing"

	"github.com/sluicehq/sluice"
)

// The method sets Concurrency and Rate offer beyond sluice.Limiter; Noop
// must have them too to stand in for either.
type (
	concurrencyMethods interface {
		Acquire(ctx context.Context) error
		AcquireN(ctx context.Context, n int) error
		Release()
		ReleaseN(n int)
		Do(ctx context.Context, fn func(ctx context.Context) error) error
	}
	rateMethods interface {
		Enter(ctx context.Context) error
		EnterN(ctx context.Context, n int) error
		Do(ctx context.Context, fn func(ctx context.Context) error) error
	}
)

var (
	_ concurrencyMethods = (*Concurrency)(nil)
	_ concurrencyMethods = Noop{}
	_ rateMethods        = (*Rate)(nil)
	_ rateMethods        = Noop{}
)

func TestNoop(t *testing.T) {
	live := context.Background()
	dead, cancel := context.WithCancel(live)
	cancel()
	boom := errors.New("boom")
	tests := []struct {
		name    string
		ctx     context.Context
		wantErr error
		wantRan bool
	}{
		{"live context", live, boom, true},
		{"ended context", dead, context.Canceled, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var n Noop
			ran := false
			err := n.Do(tt.ctx, func(context.Context) error { ran = true; return boom })
			if !errors.Is(err, tt.wantErr) || ran != tt.wantRan {
				t.Errorf("Do = %v, ran %v; want %v, ran %v", err, ran, tt.wantErr, tt.wantRan)
			}
			want := tt.ctx.Err()
			if err := n.Enter(tt.ctx); err != want {
				t.Errorf("Enter = %v, want %v", err, want)
			}
			if err := n.Acquire(tt.ctx); err != want {
				t.Errorf("Acquire = %v, want %v", err, want)
			}
			n.Release()
			// No cost is too large for a Noop, and zero is fine too.
			for _, cost := range []int{0, 1, 1000, math.MaxInt} {
				if err := n.EnterN(tt.ctx, cost); err != want {
					t.Errorf("EnterN(%d) = %v, want %v", cost, err, want)
				}
				if err := n.AcquireN(tt.ctx, cost); err != want {
					t.Errorf("AcquireN(%d) = %v, want %v", cost, err, want)
				}
				n.ReleaseN(cost)
			}
			// A negative cost is an error, as it is for Rate and Concurrency.
			for name, f := range map[string]func(context.Context, int) error{"EnterN": n.EnterN, "AcquireN": n.AcquireN} {
				err := f(tt.ctx, -1)
				if err == nil || errors.Is(err, sluice.ErrLimited) || errors.Is(err, sluice.ErrCostExceedsCapacity) {
					t.Errorf("%s(-1) = %v, want an error of its own", name, err)
				}
			}
		})
	}
	// Never refuses, however often it is called.
	for i := range 10000 {
		if err := (Noop{}).Enter(live); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
}
