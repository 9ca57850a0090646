package groundwork

import (
	"context"
	"errors"
	"net"
	"time"

	"github.com/redis/go-redis/v9"
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
		return Invalid(errConfig, "nil redis client")
	case *redis.Client:
		if c == nil {
			return Invalid(errConfig, "nil redis client")
		}
		timeouts = c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		if c == nil {
			return Invalid(errConfig, "nil redis client")
		}
		timeouts = c.Options().ContextTimeoutEnabled
	case *redis.Ring:
		if c == nil {
			return Invalid(errConfig, "nil redis client")
		}
		timeouts = c.Options().ContextTimeoutEnabled
	default:
		return nil
	}
	if !timeouts {
		return Invalid(errConfig, "the redis client's options have ContextTimeoutEnabled false: go-redis would then ignore deadlines shorter than its ReadTimeout and WriteTimeout, and a caller's deadline would not hold while Redis is slow or frozen; set ContextTimeoutEnabled: true in redis.Options (or ClusterOptions, RingOptions, FailoverOptions, UniversalOptions)")
	}
	return nil
}

// probeTimeout bounds Probe's dial.
const probeTimeout = 50 * time.Millisecond

// CallError is a call to Redis that failed. It matches both its causes
// with errors.Is: the ctx error, when the caller's ctx ended (or its
// deadline passed as the socket timed out), and Redis's or the network's
// error, so a caller can tell "my deadline" from "connection refused" and
// still see both.
type CallError struct {
	Prefix string // the package, "bucket"
	Ctx    error  // context.Canceled or context.DeadlineExceeded, or nil
	Err    error  // what go-redis returned
}

func (e *CallError) Error() string {
	if e.Ctx == nil {
		return e.Prefix + ": redis: " + e.Err.Error()
	}
	return e.Prefix + ": " + e.Ctx.Error() + " (redis: " + e.Err.Error() + ")"
}

// Unwrap returns the ctx error, if any, and Redis's.
func (e *CallError) Unwrap() []error {
	if e.Ctx == nil {
		return []error{e.Err}
	}
	return []error{e.Ctx, e.Err}
}

// RedisError wraps err, the failure of a call to rdb made on ctx, as a
// CallError of package prefix. go-redis sets the socket deadline to the
// ctx's, so the socket can time out a moment before ctx.Err() is set: a
// timeout at the deadline counts as the deadline. An err that already is a
// CallError is returned as it is. An err that is the ctx's own error is
// returned as it is too, unless a dial to rdb's server is refused (Probe):
// go-redis returns only the ctx's error when the ctx ends while it backs
// off between retries of a refused dial, and the caller must still learn
// that Redis is down.
func RedisError(ctx context.Context, prefix string, rdb redis.UniversalClient, err error) error {
	if err == nil {
		return nil
	}
	var ce *CallError
	if errors.As(err, &ce) {
		return err
	}
	ctxErr := ctx.Err()
	if ctxErr != nil && errors.Is(err, ctxErr) {
		if perr := Probe(context.WithoutCancel(ctx), rdb); perr != nil {
			return &CallError{Prefix: prefix, Ctx: ctxErr, Err: perr}
		}
		return err // the ctx ended before anything was sent, or Redis is slow
	}
	if ctxErr == nil {
		var ne net.Error
		if deadline, ok := ctx.Deadline(); ok && errors.As(err, &ne) && ne.Timeout() && time.Until(deadline) < time.Millisecond {
			ctxErr = context.DeadlineExceeded
		}
	}
	return &CallError{Prefix: prefix, Ctx: ctxErr, Err: err}
}
