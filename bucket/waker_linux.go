package bucket

import (
	"runtime"
	"syscall"
	"time"
)

// preciseMargin is how long before an alarm the waker stops trusting Go
// timers (late by up to a few ms on a busy machine) and sleeps in
// nanosleep, which Linux ends within tens of µs.
const preciseMargin = 2 * time.Millisecond

// sleepThread blocks the calling thread for about d, in a system call: the
// runtime may hand the thread's P to other goroutines meanwhile, and the
// thread burns no CPU. A signal may cut the sleep short (EINTR); the
// waker's loop then sleeps again.
//
// The last sleep before an alarm (last) runs with the thread's timer slack
// at 1 µs instead of Linux's default 50 µs, by which the kernel may
// otherwise delay the wake-up to batch it with others; the thread gets its
// default back before it serves other goroutines.
func sleepThread(d time.Duration, last bool) {
	ts := syscall.NsecToTimespec(int64(d))
	if !last {
		_ = syscall.Nanosleep(&ts, nil)
		return
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	_, _, errno := syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_TIMERSLACK, uintptr(time.Microsecond), 0)
	_ = syscall.Nanosleep(&ts, nil)
	if errno == 0 {
		// 0 restores the thread's default slack.
		_, _, _ = syscall.RawSyscall(syscall.SYS_PRCTL, syscall.PR_SET_TIMERSLACK, 0, 0)
	}
}
