// Package redistest starts real redis-server processes on free loopback ports
// for tests and for cmd/bench, and injects real faults into them: SIGKILL,
// SIGSTOP/SIGCONT, restart on the same port.
//
// Only processes this package started are ever signalled, always by pid.
// Where redis-server is not on PATH, New falls back to an in-process server
// (github.com/alicebob/miniredis/v2) and says so loudly; with CI=true a
// missing redis-server fails the test instead.
package redistest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/protocol"

	"github.com/sluicehq/sluice/internal/rediskey"
)

// ErrNoRedisServer reports that redis-server is not on PATH.
var ErrNoRedisServer = errors.New("redistest: redis-server not found on PATH")

// Server is one redis-server process (or, as a fallback, an in-process
// miniredis) listening on a loopback port. Its methods are safe for
// concurrent use.
type Server struct {
	mu   sync.Mutex
	port int
	dir  string
	args []string
	own  bool // in a session of its own (StartService)
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has been waited for
	fake *miniredis.Miniredis
}

// Start starts a redis-server from PATH on a free loopback port and waits
// until it answers PING. extra arguments are passed to redis-server (for
// example "--cluster-enabled", "yes"). The caller must call Close.
func Start(extra ...string) (*Server, error) { return start(false, extra) }

// StartService is Start for a server that stands for a service of its
// own, as cmd/bench's throwaway server does: it runs in a session of its
// own, so in a CPU autogroup of its own (Linux's sched_autogroup, on by
// default, shares the CPUs between sessions first): it competes for them
// as a server on a host does, not as one more thread of the session that
// started it. In the bench's overload scenario (busy goroutines in every
// worker process, all in the bench's session) a server in the bench's
// session was starved itself: 77-79 % of the limit, where the same
// workers on a server in its own session got 91-94 %. Tests use Start,
// whose timing they were written against: semaphore/TestFallbackFleet
// beside two busy loops failed on a server in its own session (a
// worker's local grants above its share, 4 of 4 runs) and passed on one
// in theirs (3 of 3).
func StartService(extra ...string) (*Server, error) { return start(true, extra) }

func start(own bool, extra []string) (*Server, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, ErrNoRedisServer
	}
	dir, err := os.MkdirTemp("", "sluice-redis-")
	if err != nil {
		return nil, err
	}
	var lastErr error
	// A free port can be taken by someone else between our probe and
	// redis-server's bind; try a few ports before giving up.
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		s := &Server{port: port, dir: dir, own: own}
		s.args = append([]string{
			"--port", strconv.Itoa(port),
			"--bind", "127.0.0.1",
			"--save", "",
			"--appendonly", "no",
			"--dir", dir,
			"--protected-mode", "no",
			"--loglevel", "warning",
			"--logfile", filepath.Join(dir, fmt.Sprintf("redis-%d.log", port)),
		}, extra...)
		if err := s.spawn(bin); err != nil {
			lastErr = err
			continue
		}
		return s, nil
	}
	os.RemoveAll(dir)
	return nil, fmt.Errorf("redistest: could not start redis-server: %w", lastErr)
}

// New starts a server for a test and stops it in t.Cleanup. Without
// redis-server on PATH it fails the test when CI=true, and otherwise falls
// back to miniredis with a loud log line.
func New(t testing.TB, extra ...string) *Server {
	t.Helper()
	s, err := Start(extra...)
	if errors.Is(err, ErrNoRedisServer) {
		if os.Getenv("CI") == "true" {
			t.Fatalf("redis-server is required with CI=true: %v", err)
		}
		mr := miniredis.NewMiniRedis()
		// TTLs run on the machine's clock, as its TIME does and as a
		// real server's do (by default they only move on FastForward):
		// locks and leases expire.
		mr.ClockTTL(true)
		if err := mr.Start(); err != nil {
			t.Fatalf("miniredis: %v", err)
		}
		fmt.Fprintln(os.Stderr, "!!! redistest: redis-server not on PATH: using in-process miniredis (fault tests skip). Install redis-server for real results.")
		t.Logf("!!! using in-process miniredis, not redis-server")
		s = &Server{fake: mr}
	} else if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Close)
	return s
}

// Fake reports whether this is the in-process fallback rather than a real
// redis-server. Fault injection is impossible on a fake.
func (s *Server) Fake() bool { return s.fake != nil }

// RequireReal skips t on the in-process fallback (which New refuses with
// CI=true, so CI never skips).
func (s *Server) RequireReal(t testing.TB) {
	t.Helper()
	if s.Fake() {
		t.Skip("needs a real redis-server process (fault injection)")
	}
}

// Addr is host:port of the server.
func (s *Server) Addr() string {
	if s.fake != nil {
		return s.fake.Addr()
	}
	return "127.0.0.1:" + strconv.Itoa(s.port)
}

// URL is a redis:// URL of the server.
func (s *Server) URL() string { return "redis://" + s.Addr() }

// Pid is the redis-server process id, or 0 for the fake or a killed server.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Client returns a new client of the server with ContextTimeoutEnabled, as
// Sluice's users should configure it. The caller closes it.
func (s *Server) Client() *redis.Client {
	return redis.NewClient(&redis.Options{
		Addr:                  s.Addr(),
		ContextTimeoutEnabled: true,
		DialTimeout:           time.Second,
		MaxRetries:            -1,
	})
}

// Kill sends SIGKILL to the server and waits for it to exit.
func (s *Server) Kill() error {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGCONT) // a stopped process must be able to die
	if err := cmd.Process.Kill(); err != nil {
		return err
	}
	<-done
	return nil
}

// Pause freezes the server with SIGSTOP.
func (s *Server) Pause() error { return s.signal(syscall.SIGSTOP) }

// Resume thaws a paused server with SIGCONT.
func (s *Server) Resume() error { return s.signal(syscall.SIGCONT) }

// Restart kills the server (if running) and starts a new, empty one on the
// same port.
func (s *Server) Restart() error {
	if s.fake != nil {
		return errors.New("redistest: cannot restart the in-process fallback")
	}
	if err := s.Kill(); err != nil {
		return err
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return ErrNoRedisServer
	}
	// The old socket may linger briefly; retry the bind for a while.
	deadline := time.Now().Add(5 * time.Second)
	for {
		err := s.spawn(bin)
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Close stops the server and removes its files. It is safe to call twice.
func (s *Server) Close() {
	if s.fake != nil {
		s.fake.Close()
		return
	}
	_ = s.Kill()
	os.RemoveAll(s.dir)
}

func (s *Server) signal(sig syscall.Signal) error {
	if s.fake != nil {
		return errors.New("redistest: cannot signal the in-process fallback")
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return errors.New("redistest: server not running")
	}
	return s.cmd.Process.Signal(sig)
}

// spawn starts redis-server with s.args and waits until it answers PING.
func (s *Server) spawn(bin string) error {
	cmd := exec.Command(bin, s.args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setsid: s.own}
	if err := cmd.Start(); err != nil {
		return err
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	if err := waitPing(s.Addr(), done, 5*time.Second); err != nil {
		_ = cmd.Process.Kill()
		<-done
		return err
	}
	s.mu.Lock()
	s.cmd, s.done = cmd, done
	s.mu.Unlock()
	return nil
}

// waitPing polls the address until PING answers, the process exits, or the
// deadline passes.
func waitPing(addr string, exited <-chan struct{}, within time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		if c.Ping(ctx).Err() == nil {
			return nil
		}
		select {
		case <-exited:
			return errors.New("redistest: redis-server exited at start (port taken?)")
		case <-ctx.Done():
			return fmt.Errorf("redistest: redis-server on %s did not answer PING within %v", addr, within)
		case <-tick.C:
		}
	}
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// Slots returns the slots a bucket's scheduler wrote and no caller has
// collected yet, by caller ID (µs, Redis time): the string keys that start
// with slotPrefix (queueio.Keys.Slot). It SCANs the server: for tests and
// diagnosis, not for a hot path. On Cluster, pass the client of the node
// that holds the bucket's hash slot.
func Slots(ctx context.Context, rdb redis.Cmdable, slotPrefix string) (map[string]int64, error) {
	out := map[string]int64{}
	iter := rdb.Scan(ctx, 0, rediskey.GlobEscape(slotPrefix)+"*", 1000).Iterator()
	for iter.Next(ctx) {
		key := iter.Val()
		raw, err := rdb.Get(ctx, key).Result()
		if errors.Is(err, redis.Nil) {
			continue // collected or expired meanwhile
		}
		if err != nil {
			return nil, err
		}
		v, _, ok := protocol.ParseSlotValue(raw)
		if !ok {
			return nil, fmt.Errorf("slot key %s holds %q", key, raw)
		}
		out[strings.TrimPrefix(key, slotPrefix)] = v
	}
	return out, iter.Err()
}
