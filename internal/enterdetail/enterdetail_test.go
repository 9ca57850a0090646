package enterdetail

import (
	"context"
	"testing"
	"time"
)

func TestWithFrom(t *testing.T) {
	ctx := context.Background()
	if d := From(ctx); d != nil {
		t.Fatalf("From a plain ctx: %v, want nil", d)
	}
	var d Detail
	ctx, cancel := context.WithTimeout(With(ctx, &d), time.Second)
	defer cancel()
	if got := From(ctx); got != &d {
		t.Fatalf("From a ctx made by With (wrapped since): %p, want %p", got, &d)
	}
}

// BenchmarkFromNone is what an Enter that asks for no detail pays: one
// lookup through a ctx of a few layers.
func BenchmarkFromNone(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.WithValue(context.Background(), struct{ x int }{}, 1), time.Hour)
	defer cancel()
	b.ReportAllocs()
	for b.Loop() {
		if From(ctx) != nil {
			b.Fatal("a detail nobody asked for")
		}
	}
}
