package queue

import "testing"

// TestKeys pins the key layout: the tests of packages scheduler and bucket
// spell out the unexported keys from Queue's start (stateKey, testKeys),
// and every key shares the bucket's hash tag.
func TestKeys(t *testing.T) {
	k := newKeys("sluice", "a{b}")
	base := "sluice:{a%7Bb%7D}:"
	want := map[string]string{
		"queue": k.Queue, "state": k.state, "slot:": k.Slot, "lock": k.Lock, "wake": k.Wake,
		"config": k.config, "refunds": k.refunds, "window:": k.window, "procs": k.Procs,
	}
	for suffix, got := range want {
		if got != base+suffix {
			t.Errorf("key %q, want %q", got, base+suffix)
		}
	}
}
