//go:build linux

package hub

import (
	"os"
	"syscall"
	"time"
	"unsafe"
)

// kernelTimer is a timerfd on CLOCK_MONOTONIC (the clock of Go's monotonic
// readings), read through the runtime's poller: a goroutine that waits on
// it parks, and the poller wakes it when the kernel timer fires, within
// tens of µs, where a Go timer is rounded to the poller's millisecond. A
// timerfd has no timer slack, unlike nanosleep.
type kernelTimer struct {
	f  *os.File // registered with the poller: reads park the goroutine
	fd uintptr  // for timerfd_settime; f.Fd() would make f blocking
}

func newKernelTimer() (*kernelTimer, error) {
	const clockMonotonic = 1
	fd, _, errno := syscall.Syscall(syscall.SYS_TIMERFD_CREATE, clockMonotonic, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errno != 0 {
		return nil, errno
	}
	return &kernelTimer{f: os.NewFile(fd, "timerfd"), fd: fd}, nil
}

// arm makes the timer fire d from now (at once if d ≤ 0), replacing any
// earlier arming. A zero value would disarm it: the least is 1 ns.
func (t *kernelTimer) arm(d time.Duration) {
	spec := struct{ interval, value syscall.Timespec }{value: syscall.NsecToTimespec(int64(max(d, time.Nanosecond)))}
	_, _, _ = syscall.Syscall6(syscall.SYS_TIMERFD_SETTIME, t.fd, 0, uintptr(unsafe.Pointer(&spec)), 0, 0, 0)
}

// wait returns once the timer has fired since the last wait (at once if it
// has already), or the timer is closed.
func (t *kernelTimer) wait() {
	var expirations [8]byte
	_, _ = t.f.Read(expirations[:])
}

func (t *kernelTimer) close() { _ = t.f.Close() }
