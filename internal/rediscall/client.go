// Package rediscall is how every limiter of this module calls Redis for a
// caller: clients whose options would break deadlines are refused at
// construction (CheckClient), each call is bounded (CallCtx, AnswerWithin)
// and its error says what happened in words a user can act on (CallError,
// RedisError), matching both the caller's ctx error and Redis's own.
package rediscall

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/configerr"
	"github.com/sluicehq/sluice/internal/scriptreply"
)

// CheckClient refuses, wrapping errConfig, a nil client and a client that
// would not honour the caller's deadlines: without ContextTimeoutEnabled,
// go-redis sets each socket's deadline from its ReadTimeout and
// WriteTimeout (3 s by default, or never with -1) and ignores the ctx's,
// so a frozen Redis would hold a call with a 200 ms deadline for seconds.
// Clients of other types (wrappers) are accepted as they are: their
// options cannot be read.
func CheckClient(errConfig error, rdb redis.UniversalClient) error {
	var timeouts bool
	switch c := rdb.(type) {
	case nil:
		return configerr.Invalid(errConfig, "nil redis client")
	case *redis.Client:
		if c == nil {
			return configerr.Invalid(errConfig, "nil redis client")
		}
		timeouts = c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		if c == nil {
			return configerr.Invalid(errConfig, "nil redis client")
		}
		timeouts = c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		if c == nil {
			return configerr.Invalid(errConfig, "nil redis client")
		}
		timeouts = c.Options().ContextTimeoutEnabled
	default:
		return nil
	}
	if !timeouts {
		return configerr.Invalid(errConfig, "the redis client's options have ContextTimeoutEnabled false: go-redis would then ignore deadlines shorter than its ReadTimeout and WriteTimeout, and a caller's deadline would not hold while Redis is slow or frozen; set ContextTimeoutEnabled: true in redis.Options (or ClusterOptions, RingOptions, FailoverOptions, UniversalOptions)")
	}
	return nil
}

// probeTimeout bounds Probe's dial.
const probeTimeout = 50 * time.Millisecond

// AnswerWithin bounds each call a limiter makes to Redis for a caller
// whose ctx has no earlier deadline: a Redis that refuses connections, or
// accepts them and does not answer (frozen, or a network that drops
// packets), fails the caller within it rather than for as long as Redis
// is away. go-redis's own limits (ReadTimeout, its dial retries) are
// longer and apply per attempt. The limit counts the call's wait behind
// this process's other calls too (thousands of handles arriving at once
// under -race pushed some past 1 s with Redis healthy): a limiter asks
// Redis for a PING (hub.Answers, on a connection of its own) before it
// calls a call that ran out "no answer".
const AnswerWithin = time.Second

// CallCtx returns ctx for one call to Redis made for a caller: ctx bounded
// by limit (AnswerWithin, plus what the call makes Redis wait for, as a
// WAIT's timeout), unless its own deadline comes first; within is the
// limit it added (0: none), for RedisError.
func CallCtx(ctx context.Context, limit time.Duration) (_ context.Context, cancel context.CancelFunc, within time.Duration) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= limit {
		return ctx, func() {}, 0
	}
	ctx, cancel = context.WithTimeout(ctx, limit)
	return ctx, cancel, limit
}

// ErrNoAnswer is the cause of a call to Redis that ran out of its own time
// limit (AnswerWithin, or the semaphore's exchange limit) without a
// reason: Redis accepted the connection but did not answer.
var ErrNoAnswer = errors.New("no answer")

// ErrCutShort is the cause of a call whose socket timed out on the
// caller's own deadline: Redis had not answered when the caller's time
// was up, which says nothing of Redis (a process starved or paused while
// waiting for the reply meets it too).
var ErrCutShort = errors.New("no answer before it")

// CallError is a call to Redis that failed. It matches both its causes
// with errors.Is: the ctx error, when the caller's ctx ended (or its
// deadline passed as the socket timed out), and Redis's or the network's
// error, so a caller can tell "my deadline" from "connection refused" and
// still see both. A call that ran out of the limiter's own time limit
// (Within) does not match context.DeadlineExceeded: the caller's ctx did
// not end.
type CallError struct {
	Prefix string        // the package, "bucket"
	Name   string        // the limiter's Name, or ""
	Addr   string        // Redis's address, when the client has one
	Ctx    error         // context.Canceled or context.DeadlineExceeded, or nil
	Err    error         // what go-redis returned, or the cause found (Probe), or ErrNoAnswer
	Within time.Duration // > 0: the call got no answer within this limit of the limiter's
}

// Error says what happened in a person's words:
//
//	bucket "api": Redis at 127.0.0.1:6379 unreachable: connection refused (no answer within 1s)
//	bucket "api": context deadline exceeded; Redis at 127.0.0.1:6379 unreachable: connection refused
//	bucket "api": Redis at 127.0.0.1:6379: OOM command not allowed when used memory > 'maxmemory'.
func (e *CallError) Error() string {
	var b strings.Builder
	b.WriteString(e.Prefix)
	if e.Name != "" {
		b.WriteString(" " + strconv.Quote(e.Name))
	}
	b.WriteString(": ")
	if e.Ctx != nil {
		b.WriteString(e.Ctx.Error() + "; ")
	}
	b.WriteString("Redis")
	if e.Addr != "" {
		b.WriteString(" at " + e.Addr)
	}
	why, away := Words(e.Err)
	switch {
	case e.Within > 0 && errors.Is(e.Err, ErrNoAnswer):
		b.WriteString(" unreachable: no answer within " + Round(e.Within))
	case e.Within > 0:
		b.WriteString(" unreachable: " + why + " (no answer within " + Round(e.Within) + ")")
	case away:
		b.WriteString(" unreachable: " + why)
	default:
		b.WriteString(": " + why)
	}
	return b.String()
}

// Unwrap returns the ctx error, if any, and Redis's.
func (e *CallError) Unwrap() []error {
	if e.Ctx == nil {
		return []error{e.Err}
	}
	return []error{e.Ctx, e.Err}
}

// WithCtx returns a copy of e that also matches ctxErr (the caller's ctx
// ended while Redis was unreachable).
func (e *CallError) WithCtx(ctxErr error) *CallError {
	c := *e
	c.Ctx = ctxErr
	return &c
}

// Words says err, a failed call's cause, as a person reads it, and whether
// it means Redis cannot be reached (the network's, not Redis's, error):
// "connection refused" rather than "dial tcp 127.0.0.1:6379: connect:
// connection refused", whose address the CallError already names; a
// script's refusal as the script raised it (scriptreply.Raised).
func Words(err error) (why string, away bool) {
	var errno syscall.Errno
	var dns *net.DNSError
	var ne net.Error
	switch {
	case err == nil:
		return "no error", false
	case errors.Is(err, ErrCutShort):
		return ErrCutShort.Error(), false
	case errors.Is(err, ErrNoAnswer):
		return "no answer", true
	case errors.As(err, &errno):
		switch errno {
		case syscall.ECONNREFUSED:
			return "connection refused", true
		case syscall.ECONNRESET:
			return "connection reset", true
		case syscall.ETIMEDOUT:
			return "connection timed out", true
		case syscall.EHOSTUNREACH, syscall.ENETUNREACH:
			return errno.Error(), true
		}
	case errors.As(err, &dns):
		return "cannot resolve " + dns.Name + ": " + dns.Err, true
	case errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, net.ErrClosed):
		return "connection closed", true
	case errors.As(err, &ne) && ne.Timeout():
		return "no answer (network timeout)", true
	}
	if msg, ok := scriptreply.Raised(err); ok {
		// A script's refusal, without the wrapping that differs between
		// Redis and miniredis (the script's hash, a Lua stack trace).
		return msg, false
	}
	var op *net.OpError
	if errors.As(err, &op) {
		return err.Error(), true
	}
	return err.Error(), false
}

// Round is d as a person reads it: "1.3s", "250ms", "2m0s", never
// "1.333333332s".
func Round(d time.Duration) string {
	switch {
	case d >= 10*time.Second:
		d = d.Round(time.Second)
	case d >= time.Second:
		d = d.Round(100 * time.Millisecond)
	case d >= 10*time.Millisecond:
		d = d.Round(time.Millisecond)
	case d >= 10*time.Microsecond:
		d = d.Round(time.Microsecond)
	}
	return d.String()
}

// Addr is the address of rdb's server, for errors: "" when the client
// cannot say (a wrapper, a Sentinel failover client whose master is the
// sentinels' to say, a Ring), the seed addresses of a Cluster.
func Addr(rdb redis.UniversalClient) string {
	switch c := rdb.(type) {
	case *redis.Client:
		if c == nil {
			return ""
		}
		o := c.Options()
		if o.Network == "unix" {
			return o.Addr
		}
		if _, _, err := net.SplitHostPort(o.Addr); err != nil {
			return "" // not an address: "FailoverClient"
		}
		return o.Addr
	case *redis.ClusterClient:
		if c == nil {
			return ""
		}
		return strings.Join(c.Options().Addrs, ",")
	}
	return ""
}

// RedisError wraps err, the failure of a call to rdb made on ctx for the
// limiter name of package prefix, as a CallError. within > 0 says the call
// ran on CallCtx(ctx) (or another limit of that length): when that limit,
// not ctx, ended it, the error names the cause (Probe) or says no answer
// came, and does not match the ctx's errors. go-redis sets the socket
// deadline to the ctx's, so the socket can time out a moment before
// ctx.Err() is set: a timeout at the caller's deadline counts as the
// deadline. An err that already is a CallError is returned as it is. An
// err that is the ctx's own error is returned as it is too, unless a dial
// to rdb's server is refused (Probe): go-redis returns only the ctx's
// error when the ctx ends while it backs off between retries of a refused
// dial, and the caller must still learn that Redis is down.
func RedisError(ctx context.Context, prefix, name string, rdb redis.UniversalClient, err error, within time.Duration) error {
	if err == nil {
		return nil
	}
	var ce *CallError
	if errors.As(err, &ce) {
		return err
	}
	call := &CallError{Prefix: prefix, Name: name, Addr: Addr(rdb), Err: err}
	ctxErr := ctx.Err()
	if ctxErr != nil && errors.Is(err, ctxErr) {
		if perr := Probe(context.WithoutCancel(ctx), rdb); perr != nil {
			call.Ctx, call.Err = ctxErr, perr
			return call
		}
		return err // the ctx ended before anything was sent, or Redis is slow
	}
	var ne net.Error
	timedOut := errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
	if ctxErr != nil && timedOut {
		// go-redis set the socket's deadline from ctx's: the caller's
		// time ran out, not Redis's (it was not "unreachable").
		call.Ctx, call.Err = ctxErr, fmt.Errorf("%w: %w", ErrCutShort, err)
		return call
	}
	if ctxErr == nil && timedOut {
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < time.Millisecond {
			call.Ctx = context.DeadlineExceeded
			return call
		}
		if within > 0 {
			// The limiter's own limit ended the call: say why if a dial
			// shows it, and never as the caller's deadline.
			call.Within, call.Err = within, ErrNoAnswer
			if perr := Probe(context.WithoutCancel(ctx), rdb); perr != nil {
				call.Err = perr
			}
			return call
		}
	}
	call.Ctx = ctxErr
	return call
}
