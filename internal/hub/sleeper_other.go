//go:build !linux

package hub

import "time"

// kernelTimer is a Go timer where no timerfd is known: the waker then
// keeps the Go timer's precision.
type kernelTimer struct{ t *time.Timer }

func newKernelTimer() (*kernelTimer, error) {
	t := time.NewTimer(time.Hour)
	t.Stop()
	return &kernelTimer{t: t}, nil
}

// arm makes the timer fire d from now (at once if d ≤ 0).
func (k *kernelTimer) arm(d time.Duration) { k.t.Reset(max(d, time.Nanosecond)) }

// wait returns once the timer has fired.
func (k *kernelTimer) wait() { <-k.t.C }

func (k *kernelTimer) close() { k.t.Stop() }
