package hub

import "time"

// timed is what deadlines orders: an item that knows its deadline and its
// place in the heap (-1 once out of it).
type timed interface {
	deadline() time.Time
	setIndex(i int)
}

// deadlines is a min-heap by deadline (container/heap), of the sleeper's
// alarms and of the loop's jobs.
type deadlines[T timed] []T

func (h deadlines[T]) Len() int           { return len(h) }
func (h deadlines[T]) Less(i, j int) bool { return h[i].deadline().Before(h[j].deadline()) }
func (h deadlines[T]) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].setIndex(i)
	h[j].setIndex(j)
}

func (h *deadlines[T]) Push(x any) {
	t := x.(T)
	t.setIndex(len(*h))
	*h = append(*h, t)
}

func (h *deadlines[T]) Pop() any {
	old := *h
	t := old[len(old)-1]
	var zero T
	old[len(old)-1] = zero
	t.setIndex(-1)
	*h = old[:len(old)-1]
	return t
}
