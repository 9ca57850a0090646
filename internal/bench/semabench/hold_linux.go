//go:build linux

package semabench

import (
	"fmt"
	"os"
	"syscall"
	"time"
	"unsafe"
)

// sleeper simulates a caller's work under its permit: it waits on a
// timerfd through the runtime's network poller, so the goroutine parks and
// its thread and P serve other goroutines meanwhile, as they would for a
// caller doing real I/O. The timer is the kernel's, accurate to tens of
// microseconds. One per caller goroutine; not safe for concurrent use.
//
// The earlier hold, nanosleep(2) on the goroutine's thread, pinned a P
// for the whole hold. With 10 holders and GOMAXPROCS=2 both Ps sat in
// nanosleep nearly all the time, and the runtime hands such a P over only
// when sysmon sees the same syscall on two of its ticks: once sysmon had
// stretched its tick towards 10 ms, each P had started another 5 ms
// nanosleep before the second look, so no P was ever retaken. Release
// replies and wake-ups then waited in the run queue next to idle threads
// (GODEBUG=schedtrace=100: idleprocs=0 idlethreads=11 runqueue=7-16 for
// seconds) and the run fell from ~450 grants per 250 ms to ~90, 19-40 %
// utilization: the scenario measured its own hold, not the semaphore.
// time.Sleep does not pin a P but wakes later (mean hold 5.5-5.9 ms for
// 5 ms here), which the utilization figure would charge to the semaphore.
type sleeper struct {
	f  *os.File // registered with the poller; reads park the goroutine
	fd uintptr  // for timerfd_settime; f.Fd() would make f blocking
}

func newSleeper() (*sleeper, error) {
	const clockMonotonic = 1
	fd, _, errno := syscall.Syscall(syscall.SYS_TIMERFD_CREATE, clockMonotonic, syscall.O_NONBLOCK|syscall.O_CLOEXEC, 0)
	if errno != 0 {
		return nil, fmt.Errorf("semabench: timerfd_create: %w", errno)
	}
	return &sleeper{f: os.NewFile(fd, "timerfd"), fd: fd}, nil
}

// hold returns after d.
func (s *sleeper) hold(d time.Duration) error {
	spec := struct{ interval, value syscall.Timespec }{value: syscall.NsecToTimespec(int64(max(d, time.Nanosecond)))}
	if _, _, errno := syscall.Syscall6(syscall.SYS_TIMERFD_SETTIME, s.fd, 0, uintptr(unsafe.Pointer(&spec)), 0, 0, 0); errno != 0 {
		return fmt.Errorf("semabench: timerfd_settime: %w", errno)
	}
	var expirations [8]byte
	if _, err := s.f.Read(expirations[:]); err != nil {
		return fmt.Errorf("semabench: timerfd read: %w", err)
	}
	return nil
}

func (s *sleeper) Close() error { return s.f.Close() }
