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
