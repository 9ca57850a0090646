package testkit

import (
	"context"
	"errors"
	"io"
	"net"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

// unrounded matches a duration printed to the nanosecond ("1.333333332s").
var unrounded = regexp.MustCompile(`\d\.\d{4,}`)

// How Redis went away, for CheckUnreachable.
const (
	Refused = "refused" // down before the call: the dial is refused
	Killed  = "killed"  // killed during it: refused, or the open connection cut
	Frozen  = "frozen"  // SIGSTOP: no answer, any words
)

// CheckUnreachable fails t unless err, what returned (op: "Enter",
// "Acquire") with Redis at addr away, says so in people's words: it names
// the address, matches no ctx error (the caller had no deadline), prints
// no unrounded duration and, as fault says, matches the cause: a refused
// dial (ECONNREFUSED, "connection refused"), or for a kill also a
// connection cut while a call was in flight (io.EOF, "connection closed").
func CheckUnreachable(t testing.TB, op string, err error, addr, fault string) {
	t.Helper()
	refused := errors.Is(err, syscall.ECONNREFUSED) && strings.Contains(err.Error(), "connection refused")
	cut := (errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed) || errors.Is(err, syscall.ECONNRESET)) &&
		(strings.Contains(err.Error(), "connection closed") || strings.Contains(err.Error(), "connection reset"))
	switch {
	case err == nil:
		t.Fatalf("%s with Redis away: nil error", op)
	case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
		t.Errorf("%s without a deadline: %v, which matches a ctx error", op, err)
	case !strings.Contains(err.Error(), "Redis at "+addr+" unreachable"):
		t.Errorf("%s with Redis away: %q, want it to say Redis at %s unreachable", op, err, addr)
	case unrounded.MatchString(err.Error()):
		t.Errorf("%s with Redis away: %q, a duration not rounded for people", op, err)
	case fault == Refused && !refused:
		t.Errorf("%s with Redis down: %q, want it to match and say connection refused", op, err)
	case fault == Killed && !refused && !cut:
		t.Errorf("%s with Redis killed: %q, want it to match and say connection refused, closed or reset", op, err)
	}
}

// CallersAway is a fault: Callers callers wait in Redis's queue, without
// a deadline, when Redis goes away.
type CallersAway struct {
	Op      string        // the call, for messages: "Enter", "Acquire"
	Callers int           // how many call at once
	Call    func() error  // one caller's call, without a deadline
	Queued  func() bool   // whether all the callers wait in Redis's queue
	GoAway  func() error  // kills or freezes Redis
	Fault   string        // Killed or Frozen, as GoAway does
	Addr    string        // Redis's address, which the errors name
	Bound   time.Duration // how soon after GoAway each caller must return
}

// Check starts the callers, waits until they are queued, calls GoAway,
// and fails t unless every caller returns within Bound of it with an
// error CheckUnreachable accepts. It gives up on the callers still
// blocked a second after Bound.
func (c CallersAway) Check(t testing.TB) {
	t.Helper()
	type result struct {
		err error
		at  time.Time
	}
	results := make(chan result, c.Callers)
	for range c.Callers {
		go func() {
			err := c.Call()
			results <- result{err, time.Now()}
		}()
	}
	WaitFor(t, 10*time.Second, "the callers to queue", c.Queued)
	awayAt := time.Now()
	if err := c.GoAway(); err != nil {
		t.Fatal(err)
	}
	var worst time.Duration
	timeout := time.After(c.Bound + time.Second)
	for i := range c.Callers {
		select {
		case r := <-results:
			took := r.at.Sub(awayAt)
			worst = max(worst, took)
			if took > c.Bound {
				t.Errorf("a caller returned %v after Redis was %s, want ≤ %v", took, c.Fault, c.Bound)
			}
			if i == 0 {
				t.Logf("first caller back after %v: %v", took.Round(time.Millisecond), r.err)
			}
			CheckUnreachable(t, c.Op, r.err, c.Addr, c.Fault)
		case <-timeout:
			t.Fatalf("%d of %d callers still blocked %v after Redis was %s", c.Callers-i, c.Callers, c.Bound+time.Second, c.Fault)
		}
	}
	t.Logf("Redis %s: all %d callers returned within %v", c.Fault, c.Callers, worst.Round(time.Millisecond))
}
