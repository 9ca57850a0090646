package bucket

import (
	"fmt"
	"testing"
)

// TestNoticesHandSlots: a message names entries with their slots; each
// registered waiter gets its own slot, others are ignored, and a slot that
// cannot be read still wakes its waiter (to poll at once).
func TestNoticesHandSlots(t *testing.T) {
	var w notices
	get := func(entry string) chan int64 {
		c := make(chan int64, 1)
		w.add(entry, waiter{c: c})
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
	var w notices
	get := func(entry string, ticket int64) chan int64 {
		c := make(chan int64, 1)
		w.add(entry, waiter{ticket: ticket, c: c})
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

// TestPokeForgets: waiters forgotten are never poked, one registered
// again under its entry is poked at its new place, the ticket order
// does not grow with the waiters forgotten (it is made again from those
// left), and with none left nothing is kept.
func TestPokeForgets(t *testing.T) {
	var w notices
	cs := map[string]chan int64{}
	for i := range 1000 {
		e := fmt.Sprintf("e%d|0", i)
		cs[e] = make(chan int64, 1)
		w.add(e, waiter{ticket: int64(i), c: cs[e]})
	}
	for i := range 990 {
		w.remove(fmt.Sprintf("e%d|0", i))
	}
	if len(w.byTicket) > 2*10+64 {
		t.Fatalf("the ticket order holds %d for 10 waiters", len(w.byTicket))
	}
	// e995 registers again, behind every other.
	again := make(chan int64, 1)
	w.add("e995|0", waiter{ticket: 5000, c: again})
	for i, want := range []string{"e990|0", "e991|0", "e992|0", "e993|0", "e994|0", "e996|0", "e997|0", "e998|0", "e999|0"} {
		if !w.poke() {
			t.Fatalf("poke %d found nobody", i)
		}
		if len(cs[want]) != 1 {
			t.Fatalf("poke %d: %s not poked", i, want)
		}
	}
	if len(cs["e995|0"]) != 0 {
		t.Fatal("e995's first registration, forgotten, was poked")
	}
	if !w.poke() || len(again) != 1 {
		t.Fatal("e995, registered again, was not poked last")
	}
	if w.poke() {
		t.Fatal("poke said it poked one with every word pending")
	}
	// The last waiters gone, an idle bucket keeps neither the map nor
	// the ticket order (forgotten entries' IDs).
	for _, e := range []string{"e990|0", "e991|0", "e992|0", "e993|0", "e994|0", "e995|0", "e996|0", "e997|0", "e998|0", "e999|0"} {
		w.remove(e)
	}
	if w.waiters != nil || w.byTicket != nil {
		t.Fatalf("with no waiter left, the bucket keeps a map of %d and a ticket order of %d", len(w.waiters), len(w.byTicket))
	}
}

// BenchmarkPoke pokes the earliest of 10,000 waiters of one process, who
// reads its word at once (a drain's chain).
func BenchmarkPoke(b *testing.B) {
	var w notices
	var first chan int64
	for i := range 10000 {
		c := make(chan int64, 1)
		if i == 0 {
			first = c
		}
		w.add(fmt.Sprintf("e%d|0", i), waiter{ticket: int64(i), c: c})
	}
	for b.Loop() {
		if !w.poke() {
			b.Fatal("nobody poked")
		}
		<-first
	}
}

// TestPokeFreshOnce: pokeFresh has each waiter poll once at most, the
// earliest not yet poked first, while poke pokes the earliest again.
func TestPokeFreshOnce(t *testing.T) {
	var w notices
	first, second := make(chan int64, 1), make(chan int64, 1)
	w.add("first|0", waiter{ticket: 1, c: first})
	w.add("second|0", waiter{ticket: 2, c: second})
	if !w.pokeFresh() || len(first) != 1 {
		t.Fatal("the first pokeFresh did not poke the earliest waiter")
	}
	<-first // it polled
	if !w.pokeFresh() || len(second) != 1 || len(first) != 0 {
		t.Fatal("the second pokeFresh did not pass over the waiter poked already")
	}
	<-second
	if w.pokeFresh() {
		t.Fatal("pokeFresh poked a waiter a second time")
	}
	if !w.poke() || len(first) != 1 {
		t.Fatal("poke did not poke the earliest waiter, poked before")
	}
}
