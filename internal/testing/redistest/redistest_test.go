package redistest_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testing/redistest"
)

func TestStartKillRestart(t *testing.T) {
	s := redistest.New(t)
	s.RequireReal(t)
	c := s.Client()
	defer c.Close()
	ctx := context.Background()
	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Kill(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING answered after SIGKILL")
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Exists(ctx, "k").Result(); err != nil || n != 0 {
		t.Fatalf("after restart: exists=%d err=%v, want an empty server", n, err)
	}
}

func TestPauseHonoursDeadline(t *testing.T) {
	s := redistest.New(t)
	s.RequireReal(t)
	c := s.Client()
	defer c.Close()
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	if err := s.Pause(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := c.Ping(ctx).Err(); err == nil {
		t.Fatal("PING answered by a frozen server")
	}
	if err := s.Resume(); err != nil {
		t.Fatal(err)
	}
	if err := c.Ping(context.Background()).Err(); err != nil {
		t.Fatalf("after SIGCONT: %v", err)
	}
}
