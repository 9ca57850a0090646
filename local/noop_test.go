package local

import (
	"context"
	"errors"
	"testing"
)

// The method set Concurrency offers beyond sluice.Limiter; Noop must have it
// too to stand in for a Concurrency.
var _ interface {
	Acquire(ctx context.Context) error
	Release()
	Do(ctx context.Context, fn func(ctx context.Context) error) error
} = Noop{}

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
		})
	}
	// Never refuses, however often it is called.
	for i := range 10000 {
		if err := (Noop{}).Enter(live); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
}
