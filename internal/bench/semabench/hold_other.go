//go:build !linux

package semabench

import "time"

// sleeper simulates a caller's work under its permit. Outside Linux it is
// time.Sleep, which parks the goroutine (see hold_linux.go for why a
// blocking syscall must not be used) but may wake up to a millisecond
// late, lowering the utilization figure.
type sleeper struct{}

func newSleeper() (*sleeper, error) { return &sleeper{}, nil }

func (*sleeper) hold(d time.Duration) error {
	time.Sleep(d)
	return nil
}

func (*sleeper) Close() error { return nil }
