package queueio

import "testing"

// TestKeys pins the key layout (the Lua reads none of it: every key comes
// in through KEYS): every key shares the bucket's hash tag.
func TestKeys(t *testing.T) {
	k := NewKeys("sluice", "a{b}")
	base := "sluice:{a%7Bb%7D}:"
	want := map[string]string{
		"queue": k.Queue, "state": k.State, "slot:": k.Slot, "lock": k.Lock, "wake": k.Wake,
		"config": k.Config, "refunds": k.Refunds, "window:": k.Window, "due": k.Due, "procs": k.Procs,
	}
	for suffix, got := range want {
		if got != base+suffix {
			t.Errorf("key %q, want %q", got, base+suffix)
		}
	}
}
