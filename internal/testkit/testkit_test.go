package testkit

import (
	"runtime"
	"sync/atomic"
	"testing"
	"time"
)

// TestWaitFor: it returns once the condition holds, and fails a test
// whose condition never does, after its deadline.
func TestWaitFor(t *testing.T) {
	var n atomic.Int32
	go func() {
		for range 3 {
			time.Sleep(time.Millisecond)
			n.Add(1)
		}
	}()
	WaitFor(t, 5*time.Second, "three ticks", func() bool { return n.Load() == 3 })

	ft := &fatalT{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		WaitFor(ft, 20*time.Millisecond, "never", func() bool { return false })
	}()
	<-done
	if !ft.failed {
		t.Fatal("WaitFor of a condition that never holds did not fail")
	}
}

// fatalT records Fatalf and ends its goroutine, as testing.T does.
type fatalT struct {
	testing.TB
	failed bool
}

func (f *fatalT) Helper() {}
func (f *fatalT) Fatalf(string, ...any) {
	f.failed = true
	runtime.Goexit()
}
