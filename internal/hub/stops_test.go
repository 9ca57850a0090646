package hub

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// stopsChild is set in the child process of TestWatchStopsSeesAStop.
const stopsChild = "SLUICE_HUB_STOPS_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(stopsChild) != "" {
		watchAndSay()
		return
	}
	os.Exit(m.Run())
}

// watchAndSay is the child: it watches its stops and prints "ready" at
// the first tick, then "stopped" once a tick said so, then exits.
func watchAndSay() {
	h := newHub(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"})) // WatchStops does no I/O
	defer h.group.Close()
	ticked, seen := make(chan struct{}), make(chan struct{})
	var first, once atomic.Bool
	h.WatchStops(func(since time.Duration) bool {
		if first.CompareAndSwap(false, true) {
			close(ticked)
		}
		if since < time.Second && once.CompareAndSwap(false, true) {
			close(seen)
		}
		return true
	})
	<-ticked
	fmt.Println("ready")
	select {
	case <-seen:
		fmt.Println("stopped")
	case <-time.After(30 * time.Second):
		fmt.Println("never stopped")
	}
}

// TestWatchStopsSeesAStop: a process the kernel stops (SIGSTOP, as the
// CFS throttles a pod at its CPU limit) finds, once it runs again, that
// it was stopped: its watchers are told how long ago.
func TestWatchStopsSeesAStop(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), stopsChild+"=1")
	stderr, err := os.Create(filepath.Join(t.TempDir(), "stderr"))
	if err != nil {
		t.Fatal(err)
	}
	defer stderr.Close()
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	lines := make(chan string, 4)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- strings.TrimSpace(sc.Text())
		}
		close(lines)
	}()
	// next waits for the child's next line. A line that came by the
	// deadline wins over it: when this process runs again after a stall
	// (a busy host, a paused VM), both are ready and select picks either.
	next := func(within time.Duration) string {
		select {
		case l := <-lines:
			return l
		case <-time.After(within):
			select {
			case l := <-lines:
				return l
			default:
			}
			t.Fatalf("the child said nothing within %v; its state: %s; its stderr: %q", within, procState(cmd.Process.Pid), readFile(stderr.Name()))
			return ""
		}
	}
	if l := next(20 * time.Second); l != "ready" {
		t.Fatalf("the child said %q, want ready", l)
	}
	// Stopped for 100 ms, ten ticks and far more than stopGap.
	if err := cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if err := cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	if l := next(20 * time.Second); l != "stopped" {
		t.Fatalf("the child said %q after a stop of 100 ms, want stopped", l)
	}
}

// TestWatchStopsEnds: a watcher that returns false is called no more,
// and the ticking goroutine ends with the last watcher; a new watcher
// starts it again.
func TestWatchStopsEnds(t *testing.T) {
	h := newHub(redis.NewClient(&redis.Options{Addr: "127.0.0.1:1"}))
	defer h.group.Close()
	var calls [2]atomic.Int64
	h.WatchStops(func(time.Duration) bool { return calls[0].Add(1) < 3 })
	h.WatchStops(func(time.Duration) bool { return calls[1].Add(1) < 5 })
	deadline := time.Now().Add(10 * time.Second)
	for running(h) {
		if time.Now().After(deadline) {
			t.Fatalf("still ticking after 10 s, watchers called %d and %d times", calls[0].Load(), calls[1].Load())
		}
		time.Sleep(time.Millisecond)
	}
	if a, b := calls[0].Load(), calls[1].Load(); a != 3 || b != 5 {
		t.Fatalf("watchers called %d and %d times, want 3 and 5 (each until it returned false)", a, b)
	}
	again := make(chan struct{})
	h.WatchStops(func(time.Duration) bool { close(again); return false })
	select {
	case <-again:
	case <-time.After(10 * time.Second):
		t.Fatal("a watcher after the ticking ended was never called")
	}
}

func running(h *Hub) bool {
	h.stops.mu.Lock()
	defer h.stops.mu.Unlock()
	return h.stops.running
}

// procState is what /proc says of a process's state and where it waits,
// for a failure's message.
func procState(pid int) string {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return err.Error()
	}
	var state string
	for _, l := range strings.Split(string(status), "\n") {
		if strings.HasPrefix(l, "State:") {
			state = strings.TrimSpace(strings.TrimPrefix(l, "State:"))
		}
	}
	wchan, _ := os.ReadFile(fmt.Sprintf("/proc/%d/wchan", pid))
	return fmt.Sprintf("%s, waiting in %q", state, wchan)
}

func readFile(name string) string {
	b, err := os.ReadFile(name)
	if err != nil {
		return err.Error()
	}
	return string(b)
}
