package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"

	"github.com/sluicehq/sluice/internal/testing/buckettest"
	"github.com/sluicehq/sluice/internal/testing/redistest"
	"github.com/sluicehq/sluice/internal/testing/testkit"
)

// procsSet is what serve last gave setProcs (--procs), -1 for nothing:
// the tests run serve in their own process, whose GOMAXPROCS they keep.
var procsSet atomic.Int64

func TestMain(m *testing.M) {
	redis.SetLogger(quiet{}) // as main does
	procsSet.Store(-1)
	setProcs = func(n int) { procsSet.Store(int64(n)) }
	goleak.VerifyTestMain(m)
}

// result is what one run of the command did, as a shell would see it.
type result struct {
	stdout, stderr string
	code           int
}

// sluice runs the command in-process, as main does: the error on stderr,
// its exit code.
func sluice(t *testing.T, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	err := run(ctx, args, &stdout, &stderr)
	if err != nil {
		fmt.Fprintln(&stderr, "sluice:", err)
	}
	return result{stdout.String(), stderr.String(), exitCode(err)}
}

// ok fails t unless r exited 0 with nothing on stderr.
func (r result) ok(t *testing.T) result {
	t.Helper()
	if r.code != 0 || r.stderr != "" {
		t.Fatalf("exit %d, stderr %q, stdout %q", r.code, r.stderr, r.stdout)
	}
	return r
}

// server starts a redis-server for t and returns its URL and a client.
func server(t *testing.T) (string, *redis.Client) {
	t.Helper()
	srv := redistest.New(t)
	rdb := srv.Client()
	t.Cleanup(func() { rdb.Close() })
	return srv.URL(), rdb
}

// newBucket makes a bucket named after the test and closes it at cleanup.
var newBucket = buckettest.New

// decodeReport reads one --json inspection.
func decodeReport(t *testing.T, line string) report {
	t.Helper()
	var r report
	dec := json.NewDecoder(strings.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&r); err != nil {
		t.Fatalf("inspect --json is not a report: %v\n%s", err, line)
	}
	return r
}

// waitFor polls cond until it holds, failing t after within.
var waitFor = testkit.WaitFor

// syncBuffer is a bytes.Buffer safe to read while run writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// unreachable is a Redis URL nothing listens on: a command line refused
// as bad usage never gets that far.
const unreachable = "redis://127.0.0.1:1"

// TestBadUsage: each bad command line exits 2, before any call to Redis,
// with a message naming what is wrong, and writes nothing to stdout.
func TestBadUsage(t *testing.T) {
	r := "--redis=" + unreachable
	for _, tc := range []struct {
		args []string
		want string
	}{
		{nil, "no command given"},
		{[]string{"nope"}, `no command "nope"`},
		{[]string{"inspect", r}, "no bucket NAME"},
		{[]string{"inspect", r, "a", "b"}, "one bucket NAME"},
		{[]string{"inspect", r, "--nope", "a"}, "-nope"},
		{[]string{"inspect", "--redis", "http://localhost", "a"}, `--redis "http://localhost"`},
		{[]string{"inspect", r, "--interval", "1ms", "--watch", "a"}, "--interval 1ms"},
		{[]string{"inspect", r, "--prefix", "a{b", "a"}, "brace"},
		{[]string{"policies", r}, "no bucket NAME"},
		{[]string{"hold", r, "a"}, "want NAME DURATION"},
		{[]string{"hold", r, "a", "soon"}, `DURATION "soon"`},
		{[]string{"hold", r, "a", "0s"}, `DURATION "0s"`},
		{[]string{"set-policies", r, "a"}, "no policy given"},
		{[]string{"set-policies", r, "--rate", "200", "--burst", "5", "a"}, "want N/PERIOD"},
		{[]string{"set-policies", r, "--rate", "0/1s", "--burst", "5", "a"}, "not a whole number ≥ 1"},
		{[]string{"set-policies", r, "--rate", "200/never", "--burst", "5", "a"}, `the period "never"`},
		{[]string{"set-policies", r, "--rate", "200/1s", "a"}, "needs --burst"},
		{[]string{"set-policies", r, "--burst", "5", "a"}, "needs --rate"},
		{[]string{"set-policies", r, "--rate", "200/1s", "--burst", "0", "a"}, `burst "0"`},
		{[]string{"set-policies", r, "--carry", "some", "--rate", "2/1s", "--burst", "1", "a"}, `--carry "some"`},
		{[]string{"set-policies", r, "--policy", "unit=pu,capacity=0,refill_amount=1,refill_frequency=1s", "a"}, "capacity 0, want ≥ 1"},
		{[]string{"set-policies", r, "--policy", "unit=pu,capacity=5,refill_amount=6,refill_frequency=1s", "a"}, "refill_amount 6 above capacity 5"},
		{[]string{"set-policies", r, "--policy", "unit=pu,capacity=5,refill_amount=1,refill_frequency=1500ns", "a"}, "not a whole number of microseconds"},
		{[]string{"set-policies", r, "--policy", "unit=pu,capacity=5,refill_amount=1", "a"}, "no refill_frequency"},
		{[]string{"set-policies", r, "--policy", "unit=pu,size=5", "a"}, `unknown key "size"`},
		{[]string{"set-policies", r, "--policy", "unit=pu,rate=5/1s", "a"}, "rate and burst go together"},
		{[]string{"set-policies", r, "--policy", "capacity=5,capacity=6", "a"}, "capacity given twice"},
		{[]string{"set-policies", r, "--policy", "unit=pu,capacity=1099511627777,refill_amount=1,refill_frequency=1s", "a"}, "Capacity 1099511627777 above"},
	} {
		res := sluice(t, tc.args...)
		if res.code != 2 || !strings.Contains(res.stderr, tc.want) {
			t.Errorf("sluice %q: exit %d, stderr %q; want exit 2 and a message containing %q", tc.args, res.code, res.stderr, tc.want)
		}
		if res.stdout != "" {
			t.Errorf("sluice %q wrote to stdout: %q", tc.args, res.stdout)
		}
	}
}

// TestHelp: --help on the command and on each subcommand exits 0 and lists
// the flags on stdout.
func TestHelp(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--help"}, []string{"inspect", "policies", "set-policies", "hold", "serve", "Exit codes"}},
		{[]string{"inspect", "--help"}, []string{"-redis", "-prefix", "-watch", "-json", "-interval"}},
		{[]string{"inspect", "-h"}, []string{"-redis"}},
		{[]string{"policies", "--help"}, []string{"-redis", "-prefix", "-json"}},
		{[]string{"set-policies", "--help"}, []string{"-redis", "-prefix", "-carry", "-rate", "-burst", "-policy"}},
		{[]string{"hold", "--help"}, []string{"-redis", "-prefix", "-unit", "DURATION"}},
		{[]string{"serve", "--help"}, []string{"-redis", "-prefix", "-listen", "-config", "-token-file", "-max-waiting", "-lease"}},
	} {
		res := sluice(t, tc.args...)
		if res.code != 0 || res.stderr != "" {
			t.Errorf("sluice %q: exit %d, stderr %q", tc.args, res.code, res.stderr)
		}
		for _, w := range tc.want {
			if !strings.Contains(res.stdout, w) {
				t.Errorf("sluice %q: %q missing from\n%s", tc.args, w, res.stdout)
			}
		}
	}
}

// TestRedisDown: a Redis that does not answer is a failure (exit 1) whose
// message names the bucket and the server, never the URL's password.
func TestRedisDown(t *testing.T) {
	res := sluice(t, "inspect", "--redis", "redis://user:secret@127.0.0.1:1", "api")
	if res.code != 1 || !strings.Contains(res.stderr, `"api" on 127.0.0.1:1`) || strings.Contains(res.stderr, "secret") {
		t.Errorf("exit %d, stderr %q; want exit 1 naming the bucket and 127.0.0.1:1, without the password", res.code, res.stderr)
	}
}
