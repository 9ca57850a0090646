package testkit

import (
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync/atomic"
	"syscall"
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

// errorT records Errorf, and Fatalf as fatalT does.
type errorT struct {
	fatalT
	errs int
}

func (e *errorT) Errorf(string, ...any) { e.errs++ }

// TestCheckUnreachable: the words each fault allows pass, and the rest
// fail: a kill may cut a call in flight, a down Redis only refuses.
func TestCheckUnreachable(t *testing.T) {
	const addr = "127.0.0.1:6379"
	wrap := func(why string, cause error) error {
		return fmt.Errorf(`bucket "b": Redis at %s unreachable: %s: %w`, addr, why, cause)
	}
	refused := wrap("connection refused", syscall.ECONNREFUSED)
	closed := wrap("connection closed", io.EOF)
	for _, c := range []struct {
		err   error
		fault string
		ok    bool
	}{
		{refused, Refused, true},
		{closed, Refused, false},
		{refused, Killed, true},
		{closed, Killed, true},
		{wrap("no answer", errors.New("timeout")), Killed, false},
		{wrap("no answer", errors.New("timeout")), Frozen, true},
		{wrap("no answer after 1.333333332s", errors.New("timeout")), Frozen, false},
		{fmt.Errorf("Redis at 10.0.0.1:6379 unreachable: connection refused: %w", syscall.ECONNREFUSED), Refused, false},
		{wrap("connection refused", errors.Join(syscall.ECONNREFUSED, context.DeadlineExceeded)), Refused, false},
	} {
		et := &errorT{fatalT: fatalT{TB: t}}
		CheckUnreachable(et, "Enter", c.err, addr, c.fault)
		if got := et.errs == 0 && !et.failed; got != c.ok {
			t.Errorf("CheckUnreachable(%q, %s) passed = %v, want %v", c.err, c.fault, got, c.ok)
		}
	}
}

// TestCallersAway: callers that come back with the cause once Redis goes
// away pass; a caller still blocked a second after the bound fails the
// test.
func TestCallersAway(t *testing.T) {
	const addr = "127.0.0.1:6379"
	refused := fmt.Errorf("Redis at %s unreachable: connection refused: %w", addr, syscall.ECONNREFUSED)
	scenario := func(hang bool, release <-chan struct{}) CallersAway {
		var queued atomic.Int32
		away := make(chan struct{})
		return CallersAway{
			Op: "Enter", Callers: 5, Fault: Killed, Addr: addr, Bound: 100 * time.Millisecond,
			Call: func() error {
				if queued.Add(1) == 1 && hang {
					<-release
				} else {
					<-away
				}
				return refused
			},
			Queued: func() bool { return queued.Load() == 5 },
			GoAway: func() error { close(away); return nil },
		}
	}

	scenario(false, nil).Check(t)

	release := make(chan struct{})
	defer close(release)
	et := &errorT{fatalT: fatalT{TB: t}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		scenario(true, release).Check(et)
	}()
	<-done
	if !et.failed {
		t.Error("CallersAway.Check with a caller still blocked did not fail")
	}
}
