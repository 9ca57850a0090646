package rediscall

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Probe dials rdb's server once, within 50 ms, and returns the dial's
// error: "connection refused" when nothing listens. It names the cause of
// a call that ran out of time without one: go-redis retries a refused
// dial (DialerRetries, MaxRetries) and, when the ctx ends during a
// backoff, returns only the ctx's error. It returns nil when the dial
// succeeds (the server is there but did not answer in time) or when rdb's
// address cannot be read (a wrapper, or a Sentinel failover client, whose
// Addr is a placeholder: its master's address is the sentinels' to say).
// A custom Dialer is not used: the probe dials Options().Network and
// Addr, as go-redis's default does.
func Probe(ctx context.Context, rdb redis.UniversalClient) error {
	var network, addr string
	switch c := rdb.(type) {
	case *redis.Client:
		o := c.Options()
		network, addr = o.Network, o.Addr
	case *redis.ClusterClient:
		o := c.Options()
		if len(o.Addrs) == 0 {
			return nil
		}
		network, addr = "tcp", o.Addrs[0]
	default:
		return nil
	}
	if network == "" {
		network = "tcp"
	}
	if network == "tcp" {
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil // not an address: "FailoverClient"
		}
	}
	key := network + " " + addr
	if v, ok := probes.Load(key); ok {
		if p := v.(probe); time.Since(p.at) < probeFresh {
			return p.err
		}
	}
	err := dial(ctx, network, addr)
	probes.Store(key, probe{at: time.Now(), err: err})
	return err
}

// A probe's verdict serves every caller for probeFresh, so that a storm of
// failed calls (thousands of callers whose deadlines end together) dials
// the server a few times a second at most.
const probeFresh = 250 * time.Millisecond

type probe struct {
	at  time.Time
	err error
}

var probes sync.Map // "network addr" → probe

func dial(ctx context.Context, network, addr string) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	var d net.Dialer
	conn, err := d.DialContext(ctx, network, addr)
	if err != nil {
		if ctx.Err() != nil {
			return nil // no verdict in time: say nothing rather than guess
		}
		return err
	}
	conn.Close()
	return nil
}
