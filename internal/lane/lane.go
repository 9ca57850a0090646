// Package lane carries a call's lane in its context.Context
// (bucket.WithLane), for every limiter that serves lanes: the bucket and
// the semaphore.
package lane

import "context"

type key struct{}

// With returns ctx carrying lane name.
func With(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, key{}, name)
}

// From returns the lane ctx carries, and whether it carries one (a lane
// named "" is carried, and is an error for the limiter to report).
func From(ctx context.Context) (string, bool) {
	name, ok := ctx.Value(key{}).(string)
	return name, ok
}
