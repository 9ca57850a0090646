package rediscall

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// TestDeadlineCutsCallShort: a call whose socket times out on the
// caller's own deadline (here a paused redis-server; a paused or starved
// caller meets the same) fails with an error that matches the deadline
// and says Redis had not answered before it, not that Redis is
// unreachable: the caller cannot tell, and Redis was often fine.
func TestDeadlineCutsCallShort(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	defer rdb.Close()
	if err := rdb.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Pause(); err != nil {
		t.Fatal(err)
	}
	defer srv.Resume()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := rdb.Get(ctx, "k").Err()
	if err == nil || ctx.Err() == nil {
		t.Fatalf("GET on a paused server: %v (ctx %v), want the deadline to end it", err, ctx.Err())
	}
	if got := RedisError(ctx, "bucket", "api", rdb, err, 0); !errors.Is(got, context.DeadlineExceeded) || strings.Contains(got.Error(), "unreachable") {
		t.Errorf("go-redis's error %v read as %q: want the deadline, not unreachable", err, got)
	}
	// The socket's own timeout on that deadline (go-redis returns it, not
	// ctx's error, when the read deadline fires first).
	conn, derr := net.Dial("tcp", srv.Addr())
	if derr != nil {
		t.Fatal(derr)
	}
	defer conn.Close()
	dl, _ := ctx.Deadline()
	conn.SetReadDeadline(dl)
	conn.Write([]byte("PING\r\n"))
	_, rerr := conn.Read(make([]byte, 16))
	var ne net.Error
	if !errors.As(rerr, &ne) || !ne.Timeout() {
		t.Fatalf("read from a paused server: %v, want a timeout", rerr)
	}
	got := RedisError(ctx, "bucket", "api", rdb, rerr, 0)
	if !errors.Is(got, context.DeadlineExceeded) || !errors.Is(got, ErrCutShort) {
		t.Errorf("%v does not match the deadline and ErrCutShort", got)
	}
	if s := got.Error(); strings.Contains(s, "unreachable") || !strings.Contains(s, "no answer before it") {
		t.Errorf("got %q: want the deadline, and no answer before it, not unreachable", s)
	}
}
