package bucket

import "testing"

// TestNoticesHandSlots: a message names entries with their slots; each
// registered waiter gets its own slot, others are ignored, and a slot that
// cannot be read still wakes its waiter (to poll at once).
func TestNoticesHandSlots(t *testing.T) {
	w := notices{waiters: map[string]waiter{}}
	get := func(entry string) chan int64 {
		c := make(chan int64, 1)
		w.waiters[entry] = waiter{c: c}
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

// TestPokeEarliestWaiter: a poke has the queued caller of the earliest
// ticket poll at once, passing over one with a word pending (it polls
// soon anyway); with none left to poke it says so.
func TestPokeEarliestWaiter(t *testing.T) {
	w := notices{waiters: map[string]waiter{}}
	get := func(entry string, ticket int64) chan int64 {
		c := make(chan int64, 1)
		w.waiters[entry] = waiter{ticket: ticket, c: c}
		return c
	}
	late, first, second := get("late|0", 9), get("first|0", 3), get("second|0", 5)
	if !w.poke() {
		t.Fatal("poke found nobody, with three waiting")
	}
	select {
	case got := <-first:
		if got != pollNow {
			t.Fatalf("the first waiter got %d, want pollNow (%d)", got, pollNow)
		}
	default:
		t.Fatal("the waiter of the earliest ticket was not poked")
	}
	second <- 1700000000000123 // a slot told, not yet read
	if !w.poke() || len(first) != 1 || len(late) != 0 {
		t.Fatalf("second poke: first has %d, late %d, want first poked again (its word read, second's pending)", len(first), len(late))
	}
	if !w.poke() || len(late) != 1 {
		t.Fatalf("third poke: late has %d, want it poked (first's and second's words pending)", len(late))
	}
	if w.poke() {
		t.Fatal("poke with every waiter's word pending said it poked one")
	}
}
