package hub

import (
	"context"
	"errors"
	"github.com/sluicehq/sluice/internal/background"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestSleeperFiresEachAlarmNeverEarly sets 1000 alarms at random deadlines
// from many goroutines, takes a fifth of them out again before they are
// due, and checks that every other alarm fired, none before its deadline,
// and that the heap ends empty and the goroutine gone.
func TestSleeperFiresEachAlarmNeverEarly(t *testing.T) {
	w := &sleeper{group: background.NewGroup()}
	defer w.group.Close()
	const n = 1000
	rng := rand.New(rand.NewPCG(1, 2))
	type plan struct {
		d      time.Duration // deadline from now
		cancel bool
	}
	plans := make([]plan, n)
	for i := range plans {
		plans[i] = plan{
			d:      time.Duration(rng.Int64N(int64(30 * time.Millisecond))),
			cancel: rng.IntN(5) == 0,
		}
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for _, p := range plans {
		wg.Go(func() {
			a := &alarm{at: time.Now().Add(p.d), c: make(chan struct{})}
			if !w.add(a) {
				errs <- errors.New("add refused before close")
				return
			}
			if p.cancel {
				// Give up well before the deadline: the alarm must not
				// fire and must leave the heap.
				w.remove(a)
				select {
				case <-a.c:
					if !a.fired.Before(a.at) {
						return // it was due already: fired, not cancelled
					}
					errs <- errors.New("cancelled alarm fired early")
				default:
				}
				return
			}
			select {
			case <-a.c:
			case <-time.After(p.d + 5*time.Second):
				errs <- errors.New("alarm never fired")
				return
			}
			if now := time.Now(); a.fired.Before(a.at) || now.Before(a.at) {
				errs <- errors.New("alarm fired " + a.at.Sub(a.fired).String() + " early")
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		w.mu.Lock()
		left, running := len(w.alarms), w.running
		w.mu.Unlock()
		if left == 0 && !running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d alarms left in the heap, goroutine running %v", left, running)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestSleeperSleep checks sleep's outcomes: nil no earlier than d, the ctx's
// error, ErrStopped when done closes, and plain timers after close.
func TestSleeperSleep(t *testing.T) {
	w := &sleeper{group: background.NewGroup()}
	ctx := context.Background()
	done := make(chan struct{})

	for _, d := range []time.Duration{-time.Second, 0, 50 * time.Microsecond, 300 * time.Microsecond, 3 * time.Millisecond} {
		start := time.Now()
		if err := w.sleep(ctx, d, done); err != nil {
			t.Fatalf("sleep(%v) = %v", d, err)
		}
		if took := time.Since(start); took < d {
			t.Errorf("sleep(%v) returned after %v", d, took)
		}
	}

	cctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- w.sleep(cctx, time.Hour, done) }()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Errorf("sleep with a cancelled ctx = %v, want context.Canceled", err)
	}

	go func() { errc <- w.sleep(ctx, time.Hour, done) }()
	close(done)
	if err := <-errc; !errors.Is(err, ErrStopped) {
		t.Errorf("sleep when done closes = %v, want ErrStopped", err)
	}

	w.group.Close()
	w.group.Close() // idempotent
	start := time.Now()
	if err := w.sleep(ctx, time.Millisecond, make(chan struct{})); err != nil || time.Since(start) < time.Millisecond {
		t.Errorf("sleep after close = %v after %v, want nil after ≥ 1ms", err, time.Since(start))
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.alarms) != 0 {
		t.Errorf("%d alarms left after close", len(w.alarms))
	}
}

// BenchmarkWakeLateness measures how late a wait of 50 µs, 300 µs or
// 1.5 ms returns, with the waker and with a plain Go timer (what
// sleepToSlot used before), reporting the median and p99 lateness; "busy"
// runs as many spinning goroutines as there are Ps meanwhile (a process
// with work to do, whose poller is checked only now and then).
func BenchmarkWakeLateness(b *testing.B) {
	for _, load := range []string{"idle", "busy"} {
		for _, d := range []time.Duration{50 * time.Microsecond, 300 * time.Microsecond, 1500 * time.Microsecond} {
			for _, how := range []string{"waker", "timer"} {
				b.Run(load+"/"+how+"/"+d.String(), func(b *testing.B) {
					if load == "busy" {
						stop := make(chan struct{})
						var wg sync.WaitGroup
						for range runtime.GOMAXPROCS(0) {
							wg.Go(func() {
								for {
									select {
									case <-stop:
										return
									default:
										runtime.Gosched()
									}
								}
							})
						}
						defer wg.Wait()
						defer close(stop)
					}
					w := &sleeper{group: background.NewGroup()}
					defer w.group.Close()
					ctx := context.Background()
					done := make(chan struct{})
					var late []time.Duration
					for b.Loop() {
						start := time.Now()
						var err error
						if how == "waker" {
							err = w.sleep(ctx, d, done)
						} else {
							err = plainSleep(ctx, d, done)
						}
						if err != nil {
							b.Fatal(err)
						}
						late = append(late, time.Since(start)-d)
					}
					slices.Sort(late)
					b.ReportMetric(float64(late[len(late)/2])/1e3, "µs-late-p50")
					b.ReportMetric(float64(late[len(late)*99/100])/1e3, "µs-late-p99")
				})
			}
		}
	}
}

// TestSleeperParks: while the waker waits for an alarm, its goroutine is
// parked in the poller ("IO wait" on Linux's timerfd), not blocked in a
// system call holding a thread and its P: a thread in nanosleep keeps its
// P until sysmon takes it back, which starved a GOMAXPROCS 2 process.
func TestSleeperParks(t *testing.T) {
	w := &sleeper{group: background.NewGroup()}
	defer w.group.Close()
	a := &alarm{at: time.Now().Add(time.Hour), c: make(chan struct{})}
	if !w.add(a) {
		t.Fatal("add refused")
	}
	defer w.remove(a)
	want := "[IO wait"
	if runtime.GOOS != "linux" {
		want = "[chan receive"
	}
	deadline := time.Now().Add(5 * time.Second)
	var state string
	for time.Now().Before(deadline) {
		buf := make([]byte, 1<<20)
		for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
			if strings.Contains(g, "(*sleeper).run") {
				state = strings.SplitN(g, "\n", 2)[0]
			}
		}
		if strings.Contains(state, want) {
			return
		}
		if strings.Contains(state, "[syscall") {
			t.Fatalf("the waker holds a thread in a system call: %s", state)
		}
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("waker goroutine never seen waiting in %q; last state %q", want, state)
}
