package hub

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/internal/testing/testkit"
)

// TestListenChurn: handles of many channels start and stop listening
// while the reconciler works (the reconciler compares only the channels
// that changed). Redis ends up with exactly the channels still wanted
// subscribed, each of them delivers, and after a restart of Redis the
// connection subscribes them again.
func TestListenChurn(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	rdb := srv.Client()
	defer rdb.Close()
	h := Acquire(rdb)
	defer h.Release()
	ctx := context.Background()

	const channels = 300
	name := func(i int) string { return fmt.Sprintf("%s:%d", t.Name(), i) }
	var mu sync.Mutex
	got := map[string]int{}
	listen := func(c string) func() {
		return h.Listen(c, func(string) { mu.Lock(); got[c]++; mu.Unlock() }, nil)
	}
	var wg sync.WaitGroup
	stops := make([]func(), channels)
	for i := range channels {
		wg.Go(func() {
			stop := listen(name(i))
			if i%3 == 0 { // two listeners on a third of them, one stops
				listen(name(i))()
			}
			if i%2 == 1 {
				stop() // the odd ones stop: they are not wanted
				stop = func() {}
			}
			stops[i] = stop
		})
	}
	wg.Wait()
	var want []string
	for i := 0; i < channels; i += 2 {
		want = append(want, name(i))
	}
	subscribed := func() []string {
		cs, err := rdb.PubSubChannels(ctx, t.Name()+":*").Result()
		if err != nil {
			return nil
		}
		slices.Sort(cs)
		return cs
	}
	slices.Sort(want)
	testkit.WaitFor(t, 10*time.Second, "the wanted channels, and only those, subscribed", func() bool {
		return slices.Equal(subscribed(), want)
	})
	delivered := func(what string) {
		t.Helper()
		mu.Lock()
		clear(got)
		mu.Unlock()
		testkit.WaitFor(t, 10*time.Second, what, func() bool {
			for i := range channels {
				if err := rdb.Publish(ctx, name(i), "x").Err(); err != nil {
					return false
				}
			}
			mu.Lock()
			defer mu.Unlock()
			for _, c := range want {
				if got[c] == 0 {
					return false
				}
			}
			return true
		})
		mu.Lock()
		defer mu.Unlock()
		for i := 1; i < channels; i += 2 {
			if got[name(i)] > 0 {
				t.Errorf("%s: %d messages on a channel nobody listens on", what, got[name(i)])
			}
		}
	}
	delivered("a message on every channel wanted")

	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	testkit.WaitFor(t, 10*time.Second, "the wanted channels subscribed again after a restart", func() bool {
		return slices.Equal(subscribed(), want)
	})
	delivered("a message on every channel wanted, after the restart")

	for _, stop := range stops {
		stop()
	}
	testkit.WaitFor(t, 10*time.Second, "no channel subscribed once none is wanted", func() bool {
		cs, err := rdb.PubSubChannels(ctx, t.Name()+":*").Result()
		return err == nil && len(cs) == 0
	})
}
