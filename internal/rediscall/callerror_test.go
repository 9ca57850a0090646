package rediscall

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

func TestRound(t *testing.T) {
	for _, c := range []struct {
		d    time.Duration
		want string
	}{
		{1333333332, "1.3s"},
		{200 * time.Millisecond, "200ms"},
		{1234567 * time.Microsecond, "1.2s"},
		{12345678 * time.Microsecond, "12s"},
		{1500 * time.Microsecond, "1.5ms"},
	} {
		if got := Round(c.d); got != c.want {
			t.Errorf("Round(%v) = %q, want %q", c.d, got, c.want)
		}
	}
}

// TestCallErrorWords: a CallError says what happened in a person's words
// and still matches both its causes.
func TestCallErrorWords(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}
	for _, c := range []struct {
		err  *CallError
		want string
	}{
		{&CallError{Prefix: "bucket", Name: "api", Addr: "127.0.0.1:6379", Err: refused},
			`bucket "api": Redis at 127.0.0.1:6379 unreachable: connection refused`},
		{&CallError{Prefix: "bucket", Name: "api", Addr: "127.0.0.1:6379", Err: refused, Within: 1333333332},
			`bucket "api": Redis at 127.0.0.1:6379 unreachable: connection refused (no answer within 1.3s)`},
		{&CallError{Prefix: "semaphore", Name: "db", Err: ErrNoAnswer, Within: time.Second},
			`semaphore "db": Redis unreachable: no answer within 1s`},
		{&CallError{Prefix: "bucket", Name: "api", Addr: "h:1", Ctx: context.DeadlineExceeded, Err: refused},
			`bucket "api": context deadline exceeded; Redis at h:1 unreachable: connection refused`},
		{&CallError{Prefix: "bucket", Name: "api", Addr: "h:1", Ctx: context.DeadlineExceeded, Err: fmt.Errorf("%w: %w", ErrCutShort, os.ErrDeadlineExceeded)},
			`bucket "api": context deadline exceeded; Redis at h:1: no answer before it`},
		{&CallError{Prefix: "bucket", Addr: "h:1", Err: errors.New("OOM command not allowed")},
			`bucket: Redis at h:1: OOM command not allowed`},
		// A script's refusal, as Redis 7 and miniredis wrap it.
		{&CallError{Prefix: "bucket", Addr: "h:1", Err: redisError("ERR sluice: upgrade it script: 0123456789abcdef0123456789abcdef01234567, on @user_script:48.")},
			`bucket: Redis at h:1: sluice: upgrade it`},
		{&CallError{Prefix: "bucket", Addr: "h:1", Err: redisError("ERR Error compiling script (new function): sluice: upgrade it stack traceback:  [G]: in function 'error'")},
			`bucket: Redis at h:1: sluice: upgrade it`},
	} {
		if got := c.err.Error(); got != c.want {
			t.Errorf("got  %s\nwant %s", got, c.want)
		}
	}
	e := (&CallError{Prefix: "bucket", Err: fmt.Errorf("pool: %w", refused)}).WithCtx(context.Canceled)
	if !errors.Is(e, syscall.ECONNREFUSED) || !errors.Is(e, context.Canceled) {
		t.Errorf("%v does not match both its causes", e)
	}
}

// redisError is an error reply, as go-redis returns one.
type redisError string

func (e redisError) Error() string { return string(e) }
func (redisError) RedisError()     {}
