package bucket

import (
	"testing"

	"github.com/redis/go-redis/v9"
)

// TestWakeupsHandSlots: a message names entries with their slots; each
// registered waiter gets its own slot, others are ignored, and a slot that
// cannot be read still wakes its waiter (to poll at once).
func TestWakeupsHandSlots(t *testing.T) {
	w := wakeups{waiters: map[string]chan int64{}}
	get := func(entry string) chan int64 {
		c := make(chan int64, 1)
		w.waiters[entry] = c
		return c
	}
	a, b, c := get("a|1"), get("b|0"), get("c|5")
	msgs := make(chan *redis.Message, 1)
	msgs <- &redis.Message{Payload: "x|9 100 a|1 1700000000000123 b|0 junk c|5"}
	close(msgs)
	w.wg.Add(1)
	w.dispatch(msgs)
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
