//go:build !unix

package semabench

import "time"

func hold(d time.Duration) { time.Sleep(d) }
