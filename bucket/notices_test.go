package bucket

import "testing"

// TestNoticesHandSlots: a message names entries with their slots; each
// registered waiter gets its own slot, others are ignored, and a slot that
// cannot be read still wakes its waiter (to poll at once).
func TestNoticesHandSlots(t *testing.T) {
	w := notices{waiters: map[string]chan int64{}}
	get := func(entry string) chan int64 {
		c := make(chan int64, 1)
		w.waiters[entry] = c
		return c
	}
	a, b, c := get("a|1"), get("b|0"), get("c|5")
	w.deliver("x|9 100 a|1 1700000000000123 b|0 junk c|5")
	if got := <-a; got != 1700000000000123 {
		t.Errorf("a got slot %d", got)
	}
	if got := <-b; got != 1 {
		t.Errorf("b (unreadable slot) got %d, want 1: poll at once", got)
	}
	select {
	case got := <-c:
		t.Errorf("c, named without a slot at the end, got %d", got)
	default:
	}
}
