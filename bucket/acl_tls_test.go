package bucket_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bsm/redislock"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/bench/loadgen"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// sluiceACL is the least a Redis user needs to use Sluice's buckets with
// the default KeyPrefix: keys and channels under sluice:, the script
// commands (EVALSHA, with EVAL as go-redis's fallback, and SCRIPT LOAD at
// New), the direct poll's TIME and GETDEL, the push lane's MULTI and EXEC
// (queue/push.go: TIME, GET, RPUSH, PEXPIRE inside), the commands the scripts and the lock (github.com/bsm/redislock)
// run inside them (Redis 7 checks those against the caller's ACL too), and
// the wake-up channel's SUBSCRIBE (with PING, which go-redis sends on a
// subscribed connection). go-redis's HELLO needs no permission; Redis 7.0
// has no CLIENT SETINFO (go-redis ignores its failure). docs/guarantees.md
// quotes this line.
const sluiceACL = "on >s3cret resetkeys ~sluice:* resetchannels &sluice:* -@all " +
	"+evalsha +eval +script|load +ping +subscribe +unsubscribe +getdel +multi +exec " +
	scriptCommands

// scriptCommands are the commands run inside queue/lua/*.lua and
// redislock's scripts; TestACLCoversScripts keeps the list complete.
const scriptCommands = "+time +get +set +getrange +del +exists +pexpire +pttl +publish " +
	"+llen +rpush +lpop +lpos +lrem +lrange +ltrim +lset +lindex +zadd +zremrangebyscore +zcard +zrem +zrangebyscore +zrange +zscore +hget +hmget +hset +hdel"

// TestACLCoversScripts reads every redis.call in the scripts and the
// code they share (queue/lua, scheduler/lua, internal/protocol, and
// internal/queueio's Inspect of the lanes) and fails
// when one is missing from the ACL line, so that a new command in a
// script cannot silently break restricted users. (It read queue/lua
// only, and missed the scheduler's LTRIM of callers with costs.)
func TestACLCoversScripts(t *testing.T) {
	var files []string
	for _, dir := range []string{"../queue/lua", "../scheduler/lua", "../internal/protocol", "../internal/presence", "../internal/queueio"} {
		fs, err := filepath.Glob(dir + "/*.lua")
		if err != nil || len(fs) == 0 {
			t.Fatalf("no Lua scripts found in %s: %v", dir, err)
		}
		files = append(files, fs...)
	}
	allowed := map[string]bool{}
	for _, f := range strings.Fields(scriptCommands) {
		allowed[strings.TrimPrefix(f, "+")] = true
	}
	call := regexp.MustCompile(`redis\.(?:p?call)\(\s*['"]([A-Za-z]+)['"]`)
	for _, f := range files {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range call.FindAllStringSubmatch(string(src), -1) {
			if cmd := strings.ToLower(m[1]); !allowed[cmd] {
				t.Errorf("%s calls %s, which the ACL line does not allow", filepath.Base(f), strings.ToUpper(cmd))
			}
		}
	}
}

// TestACLUser: the bucket works for a Redis user restricted to sluice:*
// keys and channels and to sluiceACL's commands: saturated callers, a
// caller that gives up while queued, two schedulers contending for the
// lock; and the same user is refused a key outside the prefix and a
// command outside the list (so the test notices an ACL too wide).
func TestACLUser(t *testing.T) {
	srv := redistest.New(t)
	srv.RequireReal(t)
	admin := srv.Client()
	defer admin.Close()
	ctx := withTimeout(t, 30*time.Second)
	args := []any{"ACL", "SETUSER", "sluice"}
	for _, f := range strings.Fields(sluiceACL) {
		args = append(args, f)
	}
	if err := admin.Do(ctx, args...).Err(); err != nil {
		t.Fatalf("ACL SETUSER: %v", err)
	}
	user := func() *redis.Client {
		return redis.NewClient(&redis.Options{Addr: srv.Addr(), Username: "sluice", Password: "s3cret",
			ContextTimeoutEnabled: true, MaxRetries: -1})
	}
	rdb, rdb2 := user(), user()
	defer rdb.Close()
	defer rdb2.Close()

	cfg := bucket.Config{Name: t.Name(), Capacity: 3, RefillAmount: 1, RefillFrequency: 4 * time.Millisecond,
		LockTTL: 300 * time.Millisecond, MaxLateness: bucket.DefaultMaxLateness}
	b, b2 := newBucket(t, rdb, cfg), newBucket(t, rdb2, cfg) // two processes' handles
	var grants []loadgen.Grant
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, h := range []*bucket.Bucket{b, b2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			g := enterAll(ctx, h, 10, 5)
			mu.Lock()
			grants = append(grants, g...)
			mu.Unlock()
		}()
	}
	wg.Wait()
	checkGrants(t, grants, cfg)

	// A caller that gives up while queued runs cancel.lua.
	slow := cfg
	slow.Name, slow.Capacity, slow.RefillFrequency = t.Name()+"-slow", 1, time.Second
	bs := newBucket(t, rdb, slow)
	if err := bs.Enter(ctx); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	if err := bs.Enter(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("queued Enter on a 100 ms deadline: %v, want context.DeadlineExceeded", err)
	}
	cancel()
	// The cancel lands in the background.
	waitFor(t, 5*time.Second, "cancel.lua, run as the ACL user, to take the caller out", func() bool {
		n, _ := admin.LLen(ctx, bucket.Keys(bs).Queue).Result()
		return n == 0
	})
	// Obtaining a held lock takes redislock's other branch (GETRANGE).
	lk := redislock.New(rdb)
	l1, err := lk.Obtain(ctx, "sluice:{acl}:lock", time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := lk.Obtain(ctx, "sluice:{acl}:lock", time.Second, nil); !errors.Is(err, redislock.ErrNotObtained) {
		t.Errorf("second Obtain: %v, want ErrNotObtained", err)
	}
	if err := l1.Release(ctx); err != nil {
		t.Error(err)
	}

	for _, h := range []*bucket.Bucket{b, b2, bs} {
		if st := h.Stats(); st.Errors > 0 {
			t.Errorf("scheduler errors under the ACL user: %+v", st)
		}
	}
	if log, _ := admin.Do(ctx, "ACL", "LOG").Slice(); len(log) > 0 {
		t.Errorf("ACL LOG has %d denials for the bucket's own work: %v", len(log), log)
	}

	if err := rdb.Set(ctx, "other:key", "x", 0).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("SET outside sluice:*: %v, want NOPERM", err)
	}
	if err := rdb.FlushAll(ctx).Err(); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Errorf("FLUSHALL: %v, want NOPERM", err)
	}
	other := cfg
	other.KeyPrefix = "other"
	if bo, err := bucket.New(rdb, other); err != nil {
		t.Errorf("New with another prefix: %v (SCRIPT LOAD needs no key)", err)
	} else {
		err := bo.Enter(ctx)
		bo.Close()
		if err == nil || !strings.Contains(err.Error(), "NOPERM") {
			t.Errorf("Enter on a bucket outside sluice:*: %v, want NOPERM", err)
		}
	}
	t.Logf("ACL: ACL SETUSER sluice %s", sluiceACL)
}

// tlsFiles writes a self-signed CA and a server certificate for 127.0.0.1
// signed by it into dir, and returns their paths and the CA pool.
func tlsFiles(t *testing.T, dir string) (caFile, certFile, keyFile string, pool *x509.CertPool) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "sluice test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	srvTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
	}
	srvDER, err := x509.CreateCertificate(rand.Reader, srvTmpl, ca, &srvKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	if err != nil {
		t.Fatal(err)
	}
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	pool = x509.NewCertPool()
	pool.AddCert(ca)
	return write("ca.crt", "CERTIFICATE", caDER), write("server.crt", "CERTIFICATE", srvDER), write("server.key", "EC PRIVATE KEY", keyDER), pool
}

// TestTLS: redis-server with a TLS port (Debian's is built with TLS), a
// certificate from a CA made in the test, and the bucket working through
// a client that verifies it. A plain-text client on the TLS port fails, so
// the grants really went over TLS.
func TestTLS(t *testing.T) {
	dir := t.TempDir()
	caFile, certFile, keyFile, pool := tlsFiles(t, dir)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	l.Close()
	srv := redistest.New(t, "--tls-port", strconv.Itoa(port), "--tls-cert-file", certFile,
		"--tls-key-file", keyFile, "--tls-ca-cert-file", caFile, "--tls-auth-clients", "no")
	srv.RequireReal(t)
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	ctx := withTimeout(t, 30*time.Second)

	plain := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true})
	defer plain.Close()
	pctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	if err := plain.Ping(pctx).Err(); err == nil {
		t.Fatal("a plain-text PING on the TLS port answered: the port is not TLS")
	}
	cancel()

	rdb := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: true,
		TLSConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}})
	defer rdb.Close()
	cfg := bucket.Config{Name: t.Name(), Capacity: 3, RefillAmount: 1, RefillFrequency: 4 * time.Millisecond,
		LockTTL: 300 * time.Millisecond, MaxLateness: bucket.DefaultMaxLateness}
	b := newBucket(t, rdb, cfg)
	grants := enterAll(ctx, b, 10, 5)
	checkGrants(t, grants, cfg)
	t.Logf("TLS: %d grants over a verified TLS connection", len(grants))
}
