//go:build !linux

package bucket

import "time"

// preciseMargin is zero where no precise sleep is known: the waker then
// waits on Go timers alone.
const preciseMargin = 0

// sleepThread is never called when preciseMargin is zero.
func sleepThread(d time.Duration, last bool) { time.Sleep(d) }
