package redistest

// Replicas and Redis Sentinel, for failover tests: a replica of a Server,
// and sentinels (redis-server in --sentinel mode, each with its own
// writable config file) watching a master. Like every Server, they are
// started on free loopback ports and stopped by pid in t.Cleanup.

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
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// readyWithin bounds every wait of this file for processes to agree
// (a replica's first sync, sentinels discovering each other every 2 s):
// generous, for a loaded machine.
const readyWithin = 30 * time.Second

// NewReplica starts a replica of master on a free port, waits until its
// link to the master is up and its first sync done, and stops it in
// t.Cleanup. It sets the master's repl-diskless-sync-delay to 0 first (the
// default delays a first sync by 5 s, waiting for more replicas).
func NewReplica(t testing.TB, master *Server) *Server {
	t.Helper()
	return NewReplicaVia(t, master, master.Addr())
}

// NewReplicaVia is NewReplica for a replica that reaches master at addr,
// a proxy in front of it (internal/testing/faultproxy), so that a test can delay
// or cut replication alone.
func NewReplicaVia(t testing.TB, master *Server, addr string) *Server {
	t.Helper()
	master.RequireReal(t)
	ctx, cancel := context.WithTimeout(context.Background(), readyWithin)
	defer cancel()
	mc := master.Client()
	defer mc.Close()
	if err := mc.ConfigSet(ctx, "repl-diskless-sync-delay", "0").Err(); err != nil {
		t.Fatalf("redistest: master %s: %v", master.Addr(), err)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("redistest: replica of %q: %v", addr, err)
	}
	r := New(t, "--replicaof", host, port)
	rc := r.Client()
	defer rc.Close()
	err = poll(ctx, func() (bool, error) {
		info, err := rc.Info(ctx, "replication").Result()
		return infoField(info, "master_link_status") == "up" && infoField(info, "master_sync_in_progress") == "0", err
	})
	if err != nil {
		t.Fatalf("redistest: replica %s of %s never in sync: %v", r.Addr(), master.Addr(), err)
	}
	return r
}

// SentinelConfig describes the sentinels NewSentinels starts. The zero
// value is three sentinels, quorum 2, master name "sluice", a master down
// after 1 s and a failover timeout of 3 s.
type SentinelConfig struct {
	// MasterName is the name the sentinels monitor the master under,
	// redis.FailoverOptions.MasterName. "" means "sluice".
	MasterName string
	// Sentinels is how many to start; 0 means 3.
	Sentinels int
	// Quorum is how many sentinels must find the master down; 0 means a
	// majority of Sentinels.
	Quorum int
	// DownAfter is down-after-milliseconds: how long the master may not
	// answer before a sentinel deems it down. 0 means 1 s.
	DownAfter time.Duration
	// FailoverTimeout is failover-timeout; a failed attempt is retried
	// after twice this. 0 means 3 s.
	FailoverTimeout time.Duration
}

// Sentinels are redis-server processes in sentinel mode watching one
// master. Its methods are safe for concurrent use.
type Sentinels struct {
	cfg     SentinelConfig
	servers []*Server
}

// NewSentinels starts cfg.Sentinels sentinels on free ports, each with its
// own config file in a t.TempDir (sentinels rewrite it), monitoring
// master; waits until each sees the master, every other sentinel and as
// many replicas as the master has connected (start the replicas first);
// and stops them in t.Cleanup. When t fails, the end of each sentinel's
// log is logged.
func NewSentinels(t testing.TB, master *Server, cfg SentinelConfig) *Sentinels {
	t.Helper()
	master.RequireReal(t)
	if cfg.MasterName == "" {
		cfg.MasterName = "sluice"
	}
	if cfg.Sentinels == 0 {
		cfg.Sentinels = 3
	}
	if cfg.Quorum == 0 {
		cfg.Quorum = cfg.Sentinels/2 + 1
	}
	if cfg.DownAfter == 0 {
		cfg.DownAfter = time.Second
	}
	if cfg.FailoverTimeout == 0 {
		cfg.FailoverTimeout = 3 * time.Second
	}
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal(ErrNoRedisServer)
	}
	ss := &Sentinels{cfg: cfg}
	for range cfg.Sentinels {
		s, err := startSentinel(bin, t.TempDir(), master.Addr(), cfg)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				logTail(t, s)
			}
			s.Close()
		})
		ss.servers = append(ss.servers, s)
	}

	ctx, cancel := context.WithTimeout(context.Background(), readyWithin)
	defer cancel()
	mc := master.Client()
	defer mc.Close()
	info, err := mc.Info(ctx, "replication").Result()
	if err != nil {
		t.Fatalf("redistest: master %s: %v", master.Addr(), err)
	}
	replicas := infoField(info, "connected_slaves")
	if err := ss.waitReady(ctx, master.Addr(), replicas); err != nil {
		t.Fatal(err)
	}
	return ss
}

// startSentinel starts one sentinel with its config file in dir, retrying
// on another port when the free one was taken meanwhile.
func startSentinel(bin, dir, master string, cfg SentinelConfig) (*Server, error) {
	host, mport, _ := net.SplitHostPort(master)
	var lastErr error
	for attempt := 0; attempt < 5; attempt++ {
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		conf := filepath.Join(dir, "sentinel.conf")
		text := fmt.Sprintf(`port %d
bind 127.0.0.1
protected-mode no
dir %s
logfile %s
sentinel monitor %s %s %s %d
sentinel down-after-milliseconds %s %d
sentinel failover-timeout %s %d
sentinel parallel-syncs %s 1
`, port, dir, filepath.Join(dir, "sentinel.log"),
			cfg.MasterName, host, mport, cfg.Quorum,
			cfg.MasterName, cfg.DownAfter.Milliseconds(),
			cfg.MasterName, cfg.FailoverTimeout.Milliseconds(),
			cfg.MasterName)
		if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
			return nil, err
		}
		s := &Server{port: port, dir: dir, args: []string{conf, "--sentinel"}}
		if err := s.spawn(bin); err != nil {
			lastErr = err
			continue
		}
		return s, nil
	}
	return nil, fmt.Errorf("redistest: could not start a sentinel: %w", lastErr)
}

// logTail logs the last lines of a sentinel's log, which tell its view of
// a failover (+sdown, +odown, +elected-leader, +switch-master...).
func logTail(t testing.TB, s *Server) {
	b, err := os.ReadFile(filepath.Join(s.dir, "sentinel.log"))
	if err != nil {
		return
	}
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	lines = lines[max(0, len(lines)-40):]
	t.Logf("sentinel %s log (end):\n%s", s.Addr(), strings.Join(lines, "\n"))
}

// waitReady waits until every sentinel reports master as the master, with
// flags "master", the other sentinels, and replicas replicas each with its
// link to the master up.
func (ss *Sentinels) waitReady(ctx context.Context, master, replicas string) error {
	for _, s := range ss.servers {
		sc := sentinelClient(s.Addr())
		var last string
		err := poll(ctx, func() (bool, error) {
			m, err := sc.Master(ctx, ss.cfg.MasterName).Result()
			if err != nil {
				return false, err
			}
			last = fmt.Sprintf("flags %s, %s:%s, other sentinels %s, replicas %s", m["flags"], m["ip"], m["port"], m["num-other-sentinels"], m["num-slaves"])
			if m["flags"] != "master" || net.JoinHostPort(m["ip"], m["port"]) != master ||
				m["num-other-sentinels"] != strconv.Itoa(len(ss.servers)-1) || m["num-slaves"] != replicas {
				return false, nil
			}
			rs, err := sc.Replicas(ctx, ss.cfg.MasterName).Result()
			if err != nil {
				return false, err
			}
			for _, r := range rs {
				if r["flags"] != "slave" || r["master-link-status"] != "ok" {
					last = fmt.Sprintf("replica %s:%s flags %s, link %s", r["ip"], r["port"], r["flags"], r["master-link-status"])
					return false, nil
				}
			}
			return true, nil
		})
		sc.Close()
		if err != nil {
			return fmt.Errorf("redistest: sentinel %s not ready (want master %s, %d other sentinels, %s replicas; last seen: %s): %w",
				s.Addr(), master, len(ss.servers)-1, replicas, last, err)
		}
	}
	return nil
}

// MasterName is the name the sentinels monitor the master under.
func (ss *Sentinels) MasterName() string { return ss.cfg.MasterName }

// Addrs are the sentinels' host:port addresses.
func (ss *Sentinels) Addrs() []string {
	addrs := make([]string, len(ss.servers))
	for i, s := range ss.servers {
		addrs[i] = s.Addr()
	}
	return addrs
}

// Servers are the sentinel processes, to kill or pause one.
func (ss *Sentinels) Servers() []*Server { return ss.servers }

// Client returns a new go-redis failover client of the monitored master,
// with ContextTimeoutEnabled as Sluice requires. The caller closes it.
func (ss *Sentinels) Client() *redis.Client {
	return redis.NewFailoverClient(&redis.FailoverOptions{
		MasterName:            ss.cfg.MasterName,
		SentinelAddrs:         ss.Addrs(),
		ContextTimeoutEnabled: true,
		DialTimeout:           time.Second,
		MaxRetries:            -1,
	})
}

// MasterAddrs asks every sentinel for the master's address
// (SENTINEL GET-MASTER-ADDR-BY-NAME); an unreachable sentinel's is "".
func (ss *Sentinels) MasterAddrs(ctx context.Context) []string {
	out := make([]string, len(ss.servers))
	for i, s := range ss.servers {
		sc := sentinelClient(s.Addr())
		if a, err := sc.GetMasterAddrByName(ctx, ss.cfg.MasterName).Result(); err == nil && len(a) == 2 {
			out[i] = net.JoinHostPort(a[0], a[1])
		}
		sc.Close()
	}
	return out
}

// WaitFailover polls the sentinels until every one of them names the same
// master other than old, and returns it. Only a ctx that ends stops it.
func (ss *Sentinels) WaitFailover(ctx context.Context, old string) (string, error) {
	var now string
	var seen []string
	err := poll(ctx, func() (bool, error) {
		seen = ss.MasterAddrs(ctx)
		now = seen[0]
		for _, a := range seen {
			if a != now {
				return false, nil
			}
		}
		return now != "" && now != old, nil
	})
	if err != nil {
		return "", fmt.Errorf("redistest: no failover from %s (sentinels name %v): %w", old, seen, err)
	}
	return now, nil
}

func sentinelClient(addr string) *redis.SentinelClient {
	return redis.NewSentinelClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond,
		ContextTimeoutEnabled: true})
}

// poll calls cond every 20 ms until it holds or ctx ends; an error from
// cond is kept as the reason, not a stop.
func poll(ctx context.Context, cond func() (bool, error)) error {
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		ok, err := cond()
		if ok {
			return nil
		}
		if err != nil {
			last = err
		}
		select {
		case <-ctx.Done():
			return errors.Join(ctx.Err(), last)
		case <-tick.C:
		}
	}
}

// infoField is the value of field in an INFO reply, or "".
func infoField(info, field string) string {
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			return v
		}
	}
	return ""
}
