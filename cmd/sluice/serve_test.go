package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/semaphore"
)

// sidecarRun is one `sluice serve` running in-process, as main runs it.
type sidecarRun struct {
	base   string // http://127.0.0.1:port
	stop   func() // cancels the command's ctx
	done   chan error
	stdout *syncBuffer
}

// startServe runs `sluice serve --listen 127.0.0.1:0 args...` until the
// test ends (or stop), and returns once it listens.
func startServe(t *testing.T, args ...string) *sidecarRun {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sr := &sidecarRun{stop: cancel, done: make(chan error, 1), stdout: &syncBuffer{}}
	var stderr syncBuffer
	go func() {
		sr.done <- run(ctx, append([]string{"serve", "--listen", "127.0.0.1:0"}, args...), sr.stdout, &stderr)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-sr.done:
			if err != nil {
				t.Errorf("serve returned %v", err)
			}
			sr.done <- err
		case <-time.After(15 * time.Second):
			t.Errorf("serve did not return within 15 s of its ctx's end")
		}
	})
	const prefix = "listening on http://"
	waitFor(t, 5*time.Second, "serve to listen", func() bool {
		select {
		case err := <-sr.done:
			t.Fatalf("serve returned %v before listening; stderr %q", err, stderr.String())
		default:
		}
		return strings.Contains(sr.stdout.String(), prefix)
	})
	out := sr.stdout.String()
	addr, _, _ := strings.Cut(out[strings.Index(out, prefix)+len(prefix):], " ")
	sr.base = "http://" + addr
	return sr
}

// apiReply is one answer of the server.
type apiReply struct {
	code   int
	header http.Header
	body   map[string]any
	raw    string
}

func (r apiReply) num(key string) float64 {
	f, _ := r.body[key].(float64)
	return f
}

func (r apiReply) str(key string) string {
	s, _ := r.body[key].(string)
	return s
}

// testClient keeps no idle connection, so that no goroutine outlives a test.
var testClient = &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}

// call sends one request and reads the answer; headers are "Key: value".
func call(t *testing.T, ctx context.Context, method, u, body string, headers ...string) apiReply {
	t.Helper()
	req, err := http.NewRequestWithContext(ctx, method, u, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ": ")
		req.Header.Set(k, v)
	}
	resp, err := testClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	r := apiReply{code: resp.StatusCode, header: resp.Header, raw: string(raw)}
	if err := json.Unmarshal(raw, &r.body); err != nil {
		t.Fatalf("%s %s: %d, a body that is not a JSON object: %q", method, u, resp.StatusCode, raw)
	}
	return r
}

// want fails t unless r has code and its error (if any) contains each of
// words.
func (r apiReply) want(t *testing.T, what string, code int, words ...string) apiReply {
	t.Helper()
	if r.code != code {
		t.Fatalf("%s: %d %s, want %d", what, r.code, r.raw, code)
	}
	for _, w := range words {
		if !strings.Contains(r.str("error"), w) {
			t.Errorf("%s: error %q, want it to say %q", what, r.str("error"), w)
		}
	}
	return r
}

// writeConfig writes a --config file and returns its path.
func writeConfig(t *testing.T, cfg string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "sluice.json")
	if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestServeEnter: enter grants while tokens are there, answers 429 with
// Retry-After when the turn is past timeout_ms, waits its turn without a
// timeout, and says what is wrong with a cost; estimate and GET read the
// bucket the --config file set.
func TestServeEnter(t *testing.T) {
	redisURL, _ := server(t)
	name := "enter-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	cfg := writeConfig(t, fmt.Sprintf(`{"buckets": {%q: {"policies": ["rate=2/1s,burst=2", "unit=pu,capacity=100,refill_amount=10,refill_frequency=100ms"]}}}`, name))
	sr := startServe(t, "--redis", redisURL, "--config", cfg)
	ctx := context.Background()
	u := sr.base + "/v1/buckets/" + name

	for i := range 2 {
		r := call(t, ctx, "POST", u+"/enter", `{"cost": {"": 1, "pu": 10}}`).want(t, "enter within the burst", 200)
		if r.num("waited_ms") > 1000 {
			t.Errorf("enter %d waited %v ms with tokens there", i, r.num("waited_ms"))
		}
	}
	r := call(t, ctx, "POST", u+"/enter", `{"timeout_ms": 100}`).want(t, "enter past its timeout", 429, "not granted within timeout_ms")
	if ra := r.num("retry_after_ms"); ra <= 100 || ra > 600 {
		t.Errorf("retry_after_ms %v, want the turn's estimate (a refill, 500 ms, away at most)", ra)
	}
	if r.str("reason") != "wait_too_long" {
		t.Errorf("reason %q, want wait_too_long", r.str("reason"))
	}
	if r.header.Get("Retry-After") != "1" {
		t.Errorf("Retry-After %q, want 1 (whole seconds, rounded up)", r.header.Get("Retry-After"))
	}
	est := call(t, ctx, "POST", u+"/estimate", ``).want(t, "estimate", 200)
	// The grants above found the bucket full: its refills start the
	// refill lag (5 ms at most) after them (docs/design.md, Choices).
	if w := est.num("wait_ms"); w <= 0 || w > 505 {
		t.Errorf("estimate wait_ms %v, want the next refill's, within 500 ms and the refill lag", w)
	}
	start := time.Now()
	r = call(t, ctx, "POST", u+"/enter", ``).want(t, "enter with no timeout", 200)
	if waited := time.Since(start); waited < 5*time.Millisecond {
		t.Errorf("enter on an empty bucket returned after %v, want its turn (up to 500 ms)", waited)
	}
	if r.num("waited_ms") <= 0 {
		t.Errorf("waited_ms %v, want > 0", r.num("waited_ms"))
	}

	call(t, ctx, "POST", u+"/enter", `{"cost": {"tokens": 1}}`).want(t, "a unit no policy counts", 400, "tokens")
	call(t, ctx, "POST", u+"/enter", `{"cost": {"pu": 101}}`).want(t, "a cost above capacity", 400, "exceeds capacity")
	call(t, ctx, "POST", u+"/enter", `{"cost": {"pu": -1}}`).want(t, "a negative cost", 400)
	call(t, ctx, "POST", u+"/enter", `{"timeout_ms": -1}`).want(t, "a negative timeout", 400, "timeout_ms -1")

	in := call(t, ctx, "GET", u, ``).want(t, "GET the bucket", 200)
	pols, _ := in.body["policies"].([]any)
	if in.body["stored"] != true || len(pols) != 2 || in.str("bucket") != name {
		t.Errorf("GET the bucket: %s", in.raw)
	}
}

// TestServeBucketFromRedis: a bucket not in --config is served with the
// policies a library process stored; one nobody stored is 404, and the
// server stores nothing for it.
func TestServeBucketFromRedis(t *testing.T) {
	redisURL, rdb := server(t)
	sr := startServe(t, "--redis", redisURL)
	ctx := context.Background()
	cfg := bucket.Config{Name: t.Name(), Policies: []bucket.Policy{bucket.Rate(1, time.Hour, 1)}}
	b := newBucket(t, rdb, cfg)

	call(t, ctx, "POST", sr.base+"/v1/buckets/"+url.PathEscape(cfg.Name)+"/enter", ``).want(t, "enter before any process stored policies", 404, "unknown", "no configuration stored")
	call(t, ctx, "GET", sr.base+"/v1/buckets/nobody", ``).want(t, "GET an unknown bucket", 404, `"nobody"`)
	call(t, ctx, "POST", sr.base+"/v1/semaphores/nobody/acquire", ``).want(t, "acquire an unknown semaphore", 404, `"nobody"`)
	if n, err := rdb.Keys(ctx, "*").Result(); err != nil || len(n) != 0 {
		t.Fatalf("keys after requests for unknown buckets: %q, %v; want none", n, err)
	}
	if err := b.Enter(ctx); err != nil { // stores 1 an hour, and takes it
		t.Fatal(err)
	}
	r := call(t, ctx, "POST", sr.base+"/v1/buckets/"+url.PathEscape(cfg.Name)+"/enter", `{"timeout_ms": 1000}`).want(t, "enter on the library's bucket", 429)
	if ra := r.num("retry_after_ms"); ra < 3500e3 {
		t.Errorf("retry_after_ms %v, want about an hour (the library's policy, not a placeholder)", ra)
	}
}

// TestServeBadRequests: each bad request is answered with a 4xx naming
// what is wrong, before anything waits.
func TestServeBadRequests(t *testing.T) {
	redisURL, _ := server(t)
	tokenFile := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(tokenFile, []byte("s3cret\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := writeConfig(t, `{"buckets": {"a/b": {"policies": ["rate=1000/1s,burst=1000"]}}, "semaphores": {"s": {"capacity": 1}}}`)
	sr := startServe(t, "--redis", redisURL, "--config", cfg, "--token-file", tokenFile)
	ctx := context.Background()
	u := sr.base + "/v1/buckets/a%2Fb/enter"
	auth := "Authorization: Bearer s3cret"

	r := call(t, ctx, "POST", u, ``).want(t, "no token", 401, "bearer token")
	if r.header.Get("WWW-Authenticate") == "" {
		t.Error("401 without WWW-Authenticate")
	}
	call(t, ctx, "POST", u, ``, "Authorization: Bearer s3cre").want(t, "a wrong token", 401, "bearer token")
	call(t, ctx, "GET", sr.base+"/v1/semaphores/s", ``, "Authorization: Bearer wrong").want(t, "a wrong token on GET", 401)
	call(t, ctx, "GET", sr.base+"/healthz", ``).want(t, "healthz without a token", 200)

	call(t, ctx, "POST", u, ``, auth).want(t, "a name with a slash, escaped", 200)
	call(t, ctx, "POST", u, `{"cost": {"": 1}, "timeout_ms": 100`, auth).want(t, "malformed JSON", 400, "not the JSON expected")
	call(t, ctx, "POST", u, `{"cost": 1}`, auth).want(t, "a cost that is not an object", 400, "not the JSON expected")
	call(t, ctx, "POST", u, `{"costs": {"": 1}}`, auth).want(t, "an unknown field", 400, `unknown field "costs"`)
	call(t, ctx, "POST", u, `{} {}`, auth).want(t, "two JSON values", 400, "more than one")
	big := `{"cost": {"` + strings.Repeat("x", maxBody) + `": 1}}`
	call(t, ctx, "POST", u, big, auth).want(t, "an oversized body", 413, "above 65536 bytes")
	long := strings.Repeat("n", maxName+1)
	call(t, ctx, "POST", sr.base+"/v1/buckets/"+long+"/enter", ``, auth).want(t, "a name too long", 400, "want at most 200")
	call(t, ctx, "POST", sr.base+"/v1/buckets/%ff/enter", ``, auth).want(t, "a name not UTF-8", 400, "not UTF-8")
	call(t, ctx, "POST", sr.base+"/v1/buckets/a%2Fb/leave", ``, auth).want(t, "an unknown endpoint", 404, "no endpoint")
	call(t, ctx, "POST", sr.base+"/v1/buckets/a%2Fb/settle", `{"reservation": "nope"}`, auth).want(t, "settle of an unknown reservation", 404, `no open reservation "nope"`)
	call(t, ctx, "POST", sr.base+"/v1/buckets/a%2Fb/settle", `{}`, auth).want(t, "settle without a reservation", 400, "no reservation given")
	call(t, ctx, "POST", sr.base+"/v1/semaphores/s/release", `{"permit": "nope"}`, auth).want(t, "release of an unknown permit", 404, `no permit "nope"`)
	call(t, ctx, "POST", sr.base+"/v1/semaphores/s/acquire", `{"weight": 2}`, auth).want(t, "a weight above capacity", 400, "exceeds capacity")
	call(t, ctx, "POST", sr.base+"/v1/semaphores/s/acquire", `{"weight": -1}`, auth).want(t, "a negative weight", 400, "weight -1")
}

// TestServeUsage: serve's bad command lines and --config files exit 2
// naming what is wrong, before listening.
func TestServeUsage(t *testing.T) {
	r := "--redis=" + unreachable
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"serve", r, "extra"}, "no arguments expected"},
		{[]string{"serve", r, "--max-waiting", "0"}, "--max-waiting 0"},
		{[]string{"serve", r, "--lease", "1ms"}, "--lease 1ms"},
		{[]string{"serve", r, "--procs", "-1"}, "--procs -1"},
		{[]string{"serve", r, "--token-file", writeConfig(t, " \n")}, "is empty"},
		{[]string{"serve", r, "--config", writeConfig(t, `{"buckets": {"a": {"policies": ["rate=0/1s,burst=1"]}}}`)}, `bucket "a": policy "rate=0/1s,burst=1"`},
		{[]string{"serve", r, "--config", writeConfig(t, `{"buckets": {"a": {}}}`)}, `bucket "a": no policies`},
		{[]string{"serve", r, "--config", writeConfig(t, `{"bucket": {}}`)}, `unknown field "bucket"`},
		{[]string{"serve", r, "--config", writeConfig(t, `{"semaphores": {"s": {"capacity": 0}}}`)}, `semaphore "s": capacity 0`},
		{[]string{"serve", r, "--config", "/nonexistent/sluice.json"}, "no such file"},
	} {
		res := sluice(t, tc.args...)
		if res.code != 2 || !strings.Contains(res.stderr, tc.want) {
			t.Errorf("sluice %q: exit %d, stderr %q; want exit 2 and a message containing %q", tc.args, res.code, res.stderr, tc.want)
		}
	}
}

// TestServeProcs: serve runs its Go code on --procs threads, 1 unless
// GOMAXPROCS is set, which the flag overrides.
func TestServeProcs(t *testing.T) {
	for _, tc := range []struct {
		env  string // GOMAXPROCS
		args []string
		want int64 // -1: GOMAXPROCS left as it is
	}{
		{"", nil, 1},
		{"", []string{"--procs", "3"}, 3},
		{"", []string{"--procs", "0"}, 0},
		{"2", nil, -1},
		{"2", []string{"--procs", "1"}, 1},
	} {
		t.Setenv("GOMAXPROCS", tc.env)
		if tc.env == "" {
			os.Unsetenv("GOMAXPROCS")
		}
		procsSet.Store(-1)
		sr := startServe(t, append([]string{"--redis", unreachable}, tc.args...)...)
		sr.stop()
		if err := <-sr.done; err != nil {
			t.Fatalf("serve %q: %v", tc.args, err)
		}
		sr.done <- nil
		if got := procsSet.Load(); got != tc.want {
			t.Errorf("GOMAXPROCS=%q serve %q: setProcs(%d), want %d", tc.env, tc.args, got, tc.want)
		}
	}
}

// queued reads how many callers wait in the bucket, in every process.
func queued(t *testing.T, b *bucket.Bucket) int {
	t.Helper()
	in, err := b.Inspect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return in.Queued
}

// slowBucket is a bucket of 1 call an hour whose token the test took:
// callers queue behind it.
func slowBucket(t *testing.T, name string) (redisURL string, b *bucket.Bucket) {
	t.Helper()
	redisURL, rdb := server(t)
	b = newBucket(t, rdb, bucket.Config{Name: name, Policies: []bucket.Policy{bucket.Rate(1, time.Hour, 1)}})
	if err := b.Enter(context.Background()); err != nil {
		t.Fatal(err)
	}
	return redisURL, b
}

// TestServeDisconnectGivesPlaceBack: a client that goes away while queued
// leaves the queue in Redis, and frees its place under --max-waiting.
func TestServeDisconnectGivesPlaceBack(t *testing.T) {
	redisURL, b := slowBucket(t, t.Name())
	sr := startServe(t, "--redis", redisURL, "--max-waiting", "1")
	u := sr.base + "/v1/buckets/" + t.Name() + "/enter"

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(ctx, "POST", u, nil)
		resp, err := testClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	waitFor(t, 5*time.Second, "the client's caller to queue", func() bool { return queued(t, b) == 1 })
	if r := call(t, context.Background(), "POST", u, `{"timeout_ms": 10}`).want(t, "a second caller beyond --max-waiting 1", 429, "--max-waiting"); r.str("reason") != "queue_full" {
		t.Errorf("reason %q, want queue_full", r.str("reason"))
	}
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the request ended without its ctx's error")
	}
	waitFor(t, 5*time.Second, "the caller to leave the queue", func() bool { return queued(t, b) == 0 })
	// Its place under --max-waiting is free again: this one waits (and
	// is refused for its timeout, not for --max-waiting).
	call(t, context.Background(), "POST", u, `{"timeout_ms": 10}`).want(t, "a caller after the first left", 429, "not granted within timeout_ms")
}

// TestServeShutdown: at shutdown every waiting caller is answered 503,
// their places are given back, and serve returns.
func TestServeShutdown(t *testing.T) {
	redisURL, b := slowBucket(t, t.Name())
	sr := startServe(t, "--redis", redisURL)
	const callers = 3
	var wg sync.WaitGroup
	replies := make([]apiReply, callers)
	for i := range callers {
		wg.Go(func() {
			replies[i] = call(t, context.Background(), "POST", sr.base+"/v1/buckets/"+t.Name()+"/enter", ``)
		})
	}
	waitFor(t, 5*time.Second, "every caller to queue", func() bool { return queued(t, b) == callers })
	sr.stop()
	wg.Wait()
	for i, r := range replies {
		if r.code != 503 || !strings.Contains(r.str("error"), "shutting down") {
			t.Errorf("caller %d: %d %s, want 503 saying the server is shutting down", i, r.code, r.raw)
		}
	}
	select {
	case err := <-sr.done:
		sr.done <- err
	case <-time.After(10 * time.Second):
		t.Fatal("serve did not return")
	}
	if n := queued(t, b); n != 0 {
		t.Errorf("%d callers still queued after shutdown", n)
	}
	if !strings.Contains(sr.stdout.String(), "stopped") {
		t.Errorf("stdout %q does not say it stopped", sr.stdout.String())
	}
}

// TestServeReserve: reserve grants with an id; settle charges the true
// cost (the rest goes back), cancel gives it all back, and an id settles
// once.
func TestServeReserve(t *testing.T) {
	redisURL, _ := server(t)
	name := t.Name()
	cfg := writeConfig(t, fmt.Sprintf(`{"buckets": {%q: {"policies": ["unit=tokens,capacity=1000,refill_amount=1,refill_frequency=1h"]}}}`, name))
	sr := startServe(t, "--redis", redisURL, "--config", cfg)
	ctx := context.Background()
	u := sr.base + "/v1/buckets/" + name
	level := func() float64 {
		in := call(t, ctx, "GET", u, ``).want(t, "GET", 200)
		pols := in.body["policies"].([]any)
		return pols[0].(map[string]any)["tokens"].(float64)
	}

	r := call(t, ctx, "POST", u+"/reserve", `{"cost": {"tokens": 600}}`).want(t, "reserve", 200)
	id := r.str("reservation")
	if id == "" {
		t.Fatalf("reserve answered no reservation: %s", r.raw)
	}
	if l := level(); l != 400 {
		t.Errorf("after reserving 600 of 1000: %v tokens, want 400", l)
	}
	call(t, ctx, "POST", u+"/settle", `{"reservation": "`+id+`", "cost": {"tokens": 100}}`).want(t, "settle", 200)
	if l := level(); l != 900 {
		t.Errorf("after settling at 100: %v tokens, want 900", l)
	}
	call(t, ctx, "POST", u+"/settle", `{"reservation": "`+id+`", "cost": {"tokens": 1}}`).want(t, "a second settle", 404, "no open reservation")

	r = call(t, ctx, "POST", u+"/reserve", `{"cost": {"tokens": 500}}`).want(t, "reserve", 200)
	call(t, ctx, "POST", u+"/cancel", `{"reservation": "`+r.str("reservation")+`"}`).want(t, "cancel", 200)
	if l := level(); l != 900 {
		t.Errorf("after a cancel: %v tokens, want 900", l)
	}
	r = call(t, ctx, "POST", u+"/reserve", `{"cost": {"tokens": 10}}`).want(t, "reserve", 200)
	call(t, ctx, "POST", u+"/settle", `{"reservation": "`+r.str("reservation")+`", "cost": {"pu": 1}}`).want(t, "settle in a unit no policy counts", 400, "pu")
	call(t, ctx, "POST", u+"/settle", `{"reservation": "`+r.str("reservation")+`"}`).want(t, "settle at the estimate, after a refused one", 200)
	call(t, ctx, "POST", u+"/reserve", `{"cost": {"tokens": 1000}, "timeout_ms": 50}`).want(t, "reserve beyond the tokens left", 429)
}

// TestServeSemaphore: acquire holds a permit while its client renews it;
// release frees it, a permit not renewed within --lease is released by
// the server, and renew then says it is gone.
func TestServeSemaphore(t *testing.T) {
	redisURL, rdb := server(t)
	name := t.Name()
	cfg := writeConfig(t, fmt.Sprintf(`{"semaphores": {%q: {"capacity": 1}}}`, name))
	sr := startServe(t, "--redis", redisURL, "--config", cfg, "--lease", "300ms")
	ctx := context.Background()
	u := sr.base + "/v1/semaphores/" + name
	lib, err := semaphore.New(rdb, semaphore.Config{Name: name, Capacity: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Close()
	held := func() float64 { return call(t, ctx, "GET", u, ``).want(t, "GET", 200).num("held") }

	r := call(t, ctx, "POST", u+"/acquire", ``).want(t, "acquire", 200)
	id := r.str("permit")
	if id == "" || r.num("lease_ms") != 300 {
		t.Fatalf("acquire: %s", r.raw)
	}
	call(t, ctx, "POST", u+"/acquire", `{"timeout_ms": 20}`).want(t, "a second acquire on capacity 1", 429, "not granted within timeout_ms")
	// Renewed past several leases, it stays held.
	for range 4 {
		call(t, ctx, "POST", u+"/renew", `{"permit": "`+id+`"}`).want(t, "renew", 200)
		time.Sleep(100 * time.Millisecond) // the client's heartbeat period, not a wait for an event
	}
	if h := held(); h != 1 {
		t.Fatalf("held %v after renewing, want 1", h)
	}
	call(t, ctx, "POST", u+"/release", `{"permit": "`+id+`"}`).want(t, "release", 200)
	call(t, ctx, "POST", u+"/release", `{"permit": "`+id+`"}`).want(t, "a second release", 404)
	// The library's caller gets the place the server's client released.
	actx, cancel := context.WithTimeout(ctx, 5*time.Second)
	p, err := lib.Acquire(actx)
	cancel()
	if err != nil {
		t.Fatalf("a library caller after the release: %v", err)
	}
	p.Release(ctx)

	r = call(t, ctx, "POST", u+"/acquire", `{"timeout_ms": 5000}`).want(t, "acquire", 200)
	id = r.str("permit")
	waitFor(t, 5*time.Second, "the permit not renewed to be released", func() bool { return held() == 0 })
	call(t, ctx, "POST", u+"/renew", `{"permit": "`+id+`"}`).want(t, "renew after the lease", 404, "not renewed within its lease")
}

// TestServeHealthz: healthz says whether Redis answers.
func TestServeHealthz(t *testing.T) {
	sr := startServe(t, "--redis", unreachable)
	call(t, context.Background(), "GET", sr.base+"/healthz", ``).want(t, "healthz with Redis down", 503, "127.0.0.1:1")
}

// TestServeConcurrentFirstRequests: many first requests for one bucket
// at once share one handle, and all are granted.
func TestServeConcurrentFirstRequests(t *testing.T) {
	redisURL, rdb := server(t)
	b := newBucket(t, rdb, bucket.Config{Name: t.Name(), Policies: []bucket.Policy{bucket.Rate(1, time.Hour, 100)}})
	if err := b.Enter(context.Background()); err != nil {
		t.Fatal(err)
	}
	sr := startServe(t, "--redis", redisURL)
	var wg sync.WaitGroup
	codes := make([]int, 20)
	for i := range codes {
		wg.Go(func() {
			codes[i] = call(t, context.Background(), "POST", sr.base+"/v1/buckets/"+t.Name()+"/enter", ``).code
		})
	}
	wg.Wait()
	for i, c := range codes {
		if c != 200 {
			t.Errorf("request %d: %d", i, c)
		}
	}
	in := call(t, context.Background(), "GET", sr.base+"/v1/buckets/"+t.Name(), ``).want(t, "GET", 200)
	if tokens := in.body["policies"].([]any)[0].(map[string]any)["tokens"].(float64); tokens != 100-21 {
		t.Errorf("%v tokens left after 21 grants of 100, want 79", tokens)
	}
}

// TestServeDetail: with SLUICE_SERVE_DETAIL=1 (for cmd/bench) a grant's
// reply carries its slot on the Redis clock; without it, none.
func TestServeDetail(t *testing.T) {
	redisURL, rdb := server(t)
	name := t.Name()
	cfg := writeConfig(t, fmt.Sprintf(`{"buckets": {%q: {"policies": ["rate=1000/1s,burst=10"]}}}`, name))
	plain := startServe(t, "--redis", redisURL, "--config", cfg)
	if r := call(t, context.Background(), "POST", plain.base+"/v1/buckets/"+name+"/enter", ``).want(t, "enter", 200); r.body["detail"] != nil {
		t.Errorf("a detail without %s: %s", envDetail, r.raw)
	}
	t.Setenv(envDetail, "1")
	sr := startServe(t, "--redis", redisURL, "--config", cfg)
	r := call(t, context.Background(), "POST", sr.base+"/v1/buckets/"+name+"/enter", ``).want(t, "enter", 200)
	d, _ := r.body["detail"].(map[string]any)
	now, err := rdb.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	slot, _ := d["slot_us"].(float64)
	if at := time.UnixMicro(int64(slot)); at.After(now) || now.Sub(at) > 10*time.Second {
		t.Errorf("slot_us %v (%v), want a moment before Redis's clock now (%v): %s", slot, at, now, r.raw)
	}
}

// TestServeSemaphoreDisconnect: a client that goes away while waiting for
// a permit leaves the semaphore's queue; the place it would have had goes
// to the next waiter.
func TestServeSemaphoreDisconnect(t *testing.T) {
	redisURL, rdb := server(t)
	name := t.Name()
	lib, err := semaphore.New(rdb, semaphore.Config{Name: name, Capacity: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer lib.Close()
	ctx := context.Background()
	p, err := lib.Acquire(ctx) // stores the capacity, and holds the one place
	if err != nil {
		t.Fatal(err)
	}
	sr := startServe(t, "--redis", redisURL)
	u := sr.base + "/v1/semaphores/" + name
	qs := func() float64 { return call(t, ctx, "GET", u, ``).want(t, "GET", 200).num("queued") }

	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		req, _ := http.NewRequestWithContext(cctx, "POST", u+"/acquire", nil)
		resp, err := testClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		done <- err
	}()
	waitFor(t, 5*time.Second, "the client's waiter to queue", func() bool { return qs() == 1 })
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the request ended without its ctx's error")
	}
	waitFor(t, 5*time.Second, "the waiter to leave the queue", func() bool { return qs() == 0 })
	p.Release(ctx)
	r := call(t, ctx, "POST", u+"/acquire", `{"timeout_ms": 5000}`).want(t, "acquire after the release", 200)
	call(t, ctx, "POST", u+"/release", `{"permit": "`+r.str("permit")+`"}`).want(t, "release", 200)
}
