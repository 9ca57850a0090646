package faultproxy_test

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/internal/testing/faultproxy"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// echo starts a line echo server and returns its address.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
				_, _ = io.Copy(c, c)
				c.Close()
			}()
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return ln.Addr().String()
}

func newProxy(t *testing.T, target string) *faultproxy.Proxy {
	t.Helper()
	p, err := faultproxy.New(target)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

// roundTrip sends a line and waits for its echo, returning the time taken.
func roundTrip(c net.Conn, r *bufio.Reader) (time.Duration, error) {
	c.SetDeadline(time.Now().Add(2 * time.Second))
	start := time.Now()
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return 0, err
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return 0, err
	}
	if line != "ping\n" {
		return 0, errors.New("bad echo " + line)
	}
	return time.Since(start), nil
}

func TestDelayPerRoundTrip(t *testing.T) {
	p := newProxy(t, echo(t))
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if d, err := roundTrip(c, r); err != nil || d > 20*time.Millisecond {
		t.Fatalf("undelayed round trip: %v, %v", d, err)
	}
	p.SetDelay(15*time.Millisecond, 15*time.Millisecond)
	d, err := roundTrip(c, r)
	if err != nil {
		t.Fatal(err)
	}
	if d < 30*time.Millisecond || d > 200*time.Millisecond {
		t.Fatalf("round trip with 15 ms one way: %v, want ≈ 30 ms", d)
	}
	// Pipelined writes overlap: ten lines in flight cost one delay, not ten.
	start := time.Now()
	for range 10 {
		if _, err := c.Write([]byte("ping\n")); err != nil {
			t.Fatal(err)
		}
	}
	for range 10 {
		if _, err := r.ReadString('\n'); err != nil {
			t.Fatal(err)
		}
	}
	if d := time.Since(start); d > 150*time.Millisecond {
		t.Fatalf("10 pipelined lines took %v: the delay throttles", d)
	}
}

func TestCutAndRestore(t *testing.T) {
	p := newProxy(t, echo(t))
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	r := bufio.NewReader(c)
	if _, err := roundTrip(c, r); err != nil {
		t.Fatal(err)
	}
	p.Cut()
	if _, err := roundTrip(c, r); err == nil {
		t.Fatal("a link survived the cut")
	}
	c2, err := net.Dial("tcp", p.Addr())
	if err == nil {
		_, err = roundTrip(c2, bufio.NewReader(c2))
		c2.Close()
	}
	if err == nil {
		t.Fatal("a new connection was forwarded during the cut")
	}
	if s := p.Stats(); s.Refused == 0 || s.Live != 0 {
		t.Fatalf("stats during the cut: %+v", s)
	}
	p.Restore()
	c3, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	if _, err := roundTrip(c3, bufio.NewReader(c3)); err != nil {
		t.Fatalf("after restore: %v", err)
	}
}
