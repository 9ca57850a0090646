package semabench

import (
	"bytes"
	"runtime"
	"testing"
	"time"
)

// TestHoldParks checks that a simulated hold parks its goroutine instead
// of blocking its thread in a syscall. A blocking hold (nanosleep) pins a
// P for the whole hold; with 10 holders on 2 Ps the runtime could go
// seconds without handing those Ps over, and the saturated run measured
// 19-40 % utilization with ~20 ms gaps between a release and the next
// hold (see hold_linux.go).
func TestHoldParks(t *testing.T) {
	sl, err := newSleeper()
	if err != nil {
		t.Fatal(err)
	}
	defer sl.Close()
	const d = 300 * time.Millisecond
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- sl.hold(d) }()

	// Find the holding goroutine in a dump of all goroutines and read its
	// state; a blocking syscall shows as [syscall], a parked read as
	// [IO wait] and time.Sleep as [sleep].
	var state string
	buf := make([]byte, 1<<20)
	deadline := time.Now().Add(10 * time.Second)
	for state == "" {
		select {
		case err := <-done:
			// Over before it was seen (a very busy machine): say so
			// rather than pass without checking.
			t.Fatalf("hold returned (%v) before its goroutine was seen; state unknown", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatal("holding goroutine not found in the goroutine dump")
		}
		n := runtime.Stack(buf, true)
		for _, g := range bytes.Split(buf[:n], []byte("\n\n")) {
			if !bytes.Contains(g, []byte("semabench.(*sleeper).hold")) {
				continue
			}
			head, _, _ := bytes.Cut(g, []byte("\n"))
			// "goroutine 7 [IO wait]:"; a goroutine caught while still
			// running shows [running] or [runnable]: look again.
			if _, rest, ok := bytes.Cut(head, []byte("[")); ok {
				s, _, _ := bytes.Cut(rest, []byte("]"))
				if st := string(s); st != "running" && st != "runnable" {
					state = st
				}
			}
		}
		runtime.Gosched()
	}
	if bytes.HasPrefix([]byte(state), []byte("syscall")) {
		t.Errorf("holding goroutine is in state [%s]: hold blocks its thread and P", state)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < d {
		t.Errorf("hold of %v returned after %v", d, took)
	}
}
