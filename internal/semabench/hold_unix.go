//go:build unix

package semabench

import (
	"syscall"
	"time"
)

// hold simulates d of work. time.Sleep wakes up to a millisecond late on
// Linux (the runtime's poller waits in whole milliseconds), which would
// charge the semaphore for the sleeper's lateness; nanosleep on the
// thread is accurate to tens of microseconds.
func hold(d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	for syscall.Nanosleep(&ts, &ts) == syscall.EINTR {
	}
}
