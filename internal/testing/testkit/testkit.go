// Package testkit holds the helpers the tests of every package share. It
// depends on no package of this module, so that any test may import it.
package testkit

import (
	"testing"
	"time"
)

// WaitFor polls cond every 2 ms until it holds, and fails t (naming what
// it waited for) when within passes first: a test waits on a condition
// with a deadline, never on a sleep.
func WaitFor(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", within, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
