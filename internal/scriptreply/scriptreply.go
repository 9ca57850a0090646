// Package scriptreply reads the replies of the module's scripts: lists of
// integers, and the time units the scripts count in.
package scriptreply

import (
	"errors"
	"fmt"
	"time"
)

// ErrReply reports a Redis reply of an unexpected shape.
var ErrReply = errors.New("unexpected reply from Redis")

// Ints checks that a script reply is a list of integers and returns them.
func Ints(v any, err error) ([]int64, error) {
	if err != nil {
		return nil, err
	}
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("%w: %T where a list belongs", ErrReply, v)
	}
	out := make([]int64, len(list))
	for i, e := range list {
		n, ok := e.(int64)
		if !ok {
			return nil, fmt.Errorf("%w: element %d is %T, not an integer", ErrReply, i, e)
		}
		out[i] = n
	}
	return out, nil
}

// Micros is d in whole microseconds, the unit of every duration the
// scripts read.
func Micros(d time.Duration) int64 { return d.Microseconds() }

// Dur converts a reply's count of unit into a Duration, saturating instead
// of wrapping past ±292 years (a valid config can ask for longer).
func Dur(n int64, unit time.Duration) time.Duration {
	const maxDur = time.Duration(1<<63 - 1)
	switch {
	case n > int64(maxDur/unit):
		return maxDur
	case n < -int64(maxDur/unit):
		return -maxDur
	}
	return time.Duration(n) * unit
}
