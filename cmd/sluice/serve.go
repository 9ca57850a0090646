package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	"github.com/redis/go-redis/v9"

	sl "github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/enterdetail"
	"github.com/sluicehq/sluice/semaphore"
)

// sluice serve: the library behind HTTP/JSON, for callers in any language.
// Each request is one call of package bucket or semaphore on a handle the
// server keeps per name; a request waits as the library's caller does, and
// a client that goes away gives its place back through the request's ctx.

const (
	// maxBody bounds a request's body: the largest valid one is a cost of
	// a few units.
	maxBody = 64 << 10
	// maxName bounds a bucket's or semaphore's name, in bytes.
	maxName = 200
	// callTimeout bounds the calls that do not wait their turn (settle,
	// estimate, inspect, release).
	callTimeout = 5 * time.Second
	// shutdownGrace is how long shutdown waits for the requests in flight
	// once every waiting caller has been answered.
	shutdownGrace = 10 * time.Second
	// envDetail, set to 1, makes enter's and reserve's replies carry each
	// grant's detail (grantDetail): for cmd/bench, which judges the
	// sidecar's grants with the checker as it judges the library's. It is
	// not part of the API.
	envDetail = "SLUICE_SERVE_DETAIL"
)

func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var t target
	fs := t.flags("serve", "[--redis URL] [--prefix P] [--listen ADDR] [--config FILE] [--token-file FILE]",
		"Serves buckets and semaphores over HTTP/JSON, for callers in any language (a sidecar).\n"+
			"A bucket's policies come from --config, or else from Redis (the first process's);\n"+
			"never from a request. See docs/sidecar.md for the API.\n\n"+
			"Example:\n"+
			"  sluice serve --redis redis://localhost:6379 --listen 127.0.0.1:8080 --config sluice.json\n"+
			"  curl -X POST -d '{\"timeout_ms\": 500}' http://127.0.0.1:8080/v1/buckets/api/enter")
	listen := fs.String("listen", "127.0.0.1:8080", "the `ADDR` to listen on (host:port; port 0 picks a free one)")
	configFile := fs.String("config", "", "a JSON `FILE` naming buckets' policies and semaphores' capacities (docs/sidecar.md)")
	tokenFile := fs.String("token-file", "", "a `FILE` holding the bearer token every request but /healthz must carry")
	maxWaiting := fs.Int("max-waiting", 1000, "the most callers waiting in this server per bucket or semaphore; beyond, 429 at once")
	lease := fs.Duration("lease", 10*time.Second, "how long a semaphore permit stays held without a renew from its client")
	pos, ok, err := parse(fs, args, stdout)
	if !ok {
		return err
	}
	if len(pos) > 0 {
		return usagef("serve: no arguments expected, got %q (see 'sluice serve --help')", pos)
	}
	if *maxWaiting < 1 {
		return usagef("serve: --max-waiting %d, want ≥ 1", *maxWaiting)
	}
	if *lease < 100*time.Millisecond || *lease > time.Hour {
		return usagef("serve: --lease %v, want between 100ms and 1h", *lease)
	}
	var cfg serveConfig
	if *configFile != "" {
		if cfg, err = readServeConfig(*configFile); err != nil {
			return usagef("serve: --config %s: %v", *configFile, err)
		}
	}
	var token string
	if *tokenFile != "" {
		b, err := os.ReadFile(*tokenFile)
		if err != nil {
			return usagef("serve: --token-file: %v", err)
		}
		if token = strings.TrimSpace(string(b)); token == "" {
			return usagef("serve: --token-file %s is empty", *tokenFile)
		}
	}
	rdb, err := t.client()
	if err != nil {
		return err
	}
	defer rdb.Close()
	s, err := newSidecar(rdb, sidecarOptions{
		prefix: t.prefix, addr: t.addr, config: cfg, token: token,
		maxWaiting: *maxWaiting, lease: *lease, detail: os.Getenv(envDetail) == "1",
	})
	if err != nil {
		return usagef("serve: %v", err)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		s.close()
		return fmt.Errorf("serve: %w", err)
	}
	fmt.Fprintf(stdout, "sluice serve: listening on http://%s (Redis at %s, prefix %q)\n", ln.Addr(), t.addr, t.prefix)
	err = s.serve(ctx, ln)
	fmt.Fprintln(stdout, "sluice serve: stopped")
	return err
}

// serveConfig is --config: the limits of the buckets and semaphores it
// names. A name it does not list is served with what Redis stores.
type serveConfig struct {
	Buckets    map[string]bucketConfig    `json:"buckets"`
	Semaphores map[string]semaphoreConfig `json:"semaphores"`
}

type bucketConfig struct {
	// Policies are --policy SPECs: "rate=200/1s,burst=50",
	// "unit=pu,capacity=1000,refill_amount=1,refill_frequency=60ms".
	Policies []string `json:"policies"`
	policies []bucket.Policy
}

type semaphoreConfig struct {
	Capacity int `json:"capacity"`
}

func readServeConfig(path string) (serveConfig, error) {
	var cfg serveConfig
	b, err := os.ReadFile(path)
	if err != nil {
		return cfg, err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&cfg); err != nil {
		return cfg, fmt.Errorf("not the JSON expected (docs/sidecar.md, \"Configuration\"): %v", err)
	}
	for name, bc := range cfg.Buckets {
		if err := checkName(name); err != nil {
			return cfg, fmt.Errorf("bucket %q: %v", name, err)
		}
		if len(bc.Policies) == 0 {
			return cfg, fmt.Errorf("bucket %q: no policies", name)
		}
		for _, spec := range bc.Policies {
			p, err := parsePolicy(spec)
			if err != nil {
				return cfg, fmt.Errorf("bucket %q: policy %q: %v", name, spec, err)
			}
			bc.policies = append(bc.policies, p)
		}
		cfg.Buckets[name] = bc
	}
	for name, sc := range cfg.Semaphores {
		if err := checkName(name); err != nil {
			return cfg, fmt.Errorf("semaphore %q: %v", name, err)
		}
		if sc.Capacity < 1 {
			return cfg, fmt.Errorf("semaphore %q: capacity %d, want ≥ 1", name, sc.Capacity)
		}
	}
	return cfg, nil
}

// checkName checks a name from a path or --config. The library takes any
// non-empty byte string; the server also wants UTF-8 (its replies are
// JSON) and a bound on the length.
func checkName(name string) error {
	switch {
	case name == "":
		return errors.New("empty name")
	case len(name) > maxName:
		return fmt.Errorf("name of %d bytes, want at most %d", len(name), maxName)
	case !utf8.ValidString(name):
		return errors.New("name is not UTF-8")
	}
	return nil
}

type sidecarOptions struct {
	prefix, addr string // addr names Redis in messages
	config       serveConfig
	token        string
	maxWaiting   int
	lease        time.Duration
	// granted, when set, is told of every grant of enter and reserve with
	// its slot on the Redis clock (tests judge them with the checker).
	granted func(name string, slot time.Time, rep bucket.Report, c bucket.Cost)
	// detail adds grantDetail to the replies (envDetail).
	detail bool
}

// sidecar holds one handle per bucket and semaphore it served, the
// reservations not yet settled and the permits held for clients.
type sidecar struct {
	rdb redis.UniversalClient
	opt sidecarOptions
	// observer is every handle's Config.Observer, for /metrics.
	observer *serveMetrics

	// stopping ends every request's ctx: callers waiting are answered
	// at shutdown rather than held until they give up.
	stopping context.Context
	stop     context.CancelFunc
	janitor  sync.WaitGroup

	mu           sync.Mutex
	buckets      map[string]*servedBucket
	semaphores   map[string]*servedSemaphore
	reservations map[string]*heldReservation
	permits      map[string]*heldPermit
	closed       bool
}

type servedBucket struct {
	b       *bucket.Bucket
	waiting atomic.Int64
	seen    seen // for /metrics
}

type servedSemaphore struct {
	s       *semaphore.Semaphore
	waiting atomic.Int64
	seen    seen
}

type heldReservation struct {
	bucket  string
	r       *bucket.Reservation
	expires time.Time
}

type heldPermit struct {
	semaphore string
	p         *semaphore.Permit
	expires   time.Time // its client's last renew plus the lease
}

func newSidecar(rdb redis.UniversalClient, opt sidecarOptions) (*sidecar, error) {
	s := &sidecar{
		rdb: rdb, opt: opt, observer: &serveMetrics{},
		buckets:      map[string]*servedBucket{},
		semaphores:   map[string]*servedSemaphore{},
		reservations: map[string]*heldReservation{},
		permits:      map[string]*heldPermit{},
	}
	// Check the configured limits before serving: a bad one is a usage
	// error at start, not a 500 at the first request.
	for name, bc := range opt.config.Buckets {
		b, err := bucket.New(rdb, bucket.Config{Name: name, KeyPrefix: opt.prefix, Policies: bc.policies, Observer: s.observer})
		if err != nil {
			s.closeHandles()
			return nil, fmt.Errorf("--config: bucket %q: %w", name, err)
		}
		s.buckets[name] = &servedBucket{b: b}
	}
	for name, sc := range opt.config.Semaphores {
		sem, err := semaphore.New(rdb, semaphore.Config{Name: name, KeyPrefix: opt.prefix, Capacity: sc.Capacity, Observer: s.observer})
		if err != nil {
			s.closeHandles()
			return nil, fmt.Errorf("--config: semaphore %q: %w", name, err)
		}
		s.semaphores[name] = &servedSemaphore{s: sem}
	}
	s.stopping, s.stop = context.WithCancel(context.Background())
	s.janitor.Add(1)
	go s.sweep()
	return s, nil
}

// serve answers requests on ln until ctx ends, then shuts down: every
// caller still waiting is answered 503, the requests in flight end, the
// permits held are released and the handles closed.
func (s *sidecar) serve(ctx context.Context, ln net.Listener) error {
	hs := &http.Server{
		Handler:           s.handler(),
		BaseContext:       func(net.Listener) context.Context { return s.stopping },
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		// No ReadTimeout: the server would cancel a request's ctx when it
		// passed, which ends a caller waiting its turn.
	}
	served := make(chan error, 1)
	go func() { served <- hs.Serve(ln) }()
	var err error
	select {
	case <-ctx.Done():
	case err = <-served:
		served <- err
	}
	s.stop() // answers the waiting callers
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	if serr := hs.Shutdown(sctx); serr != nil && err == nil {
		err = fmt.Errorf("serve: shutting down: %w", serr)
	}
	cancel()
	if serr := <-served; err == nil && !errors.Is(serr, http.ErrServerClosed) {
		err = serr
	}
	s.close()
	return err
}

// close stops the janitor, releases every permit held for a client and
// closes every handle. Reservations not settled stay counted at their
// estimates, as a process that dies leaves them.
func (s *sidecar) close() {
	s.stop()
	s.janitor.Wait()
	s.mu.Lock()
	s.closed = true
	permits := s.permits
	s.permits = map[string]*heldPermit{}
	s.reservations = map[string]*heldReservation{}
	s.mu.Unlock()
	for _, hp := range permits {
		hp.p.Release(context.Background()) // sent by the semaphore's Close below
	}
	s.closeHandles()
}

func (s *sidecar) closeHandles() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, sb := range s.buckets {
		sb.b.Close()
	}
	for _, ss := range s.semaphores {
		ss.s.Close()
	}
	s.buckets, s.semaphores = map[string]*servedBucket{}, map[string]*servedSemaphore{}
}

// sweep releases the permits whose client stopped renewing them and
// forgets reservations past the library's ReservationTTL, until stop.
func (s *sidecar) sweep() {
	defer s.janitor.Done()
	tick := time.NewTicker(max(s.opt.lease/10, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-s.stopping.Done():
			return
		case now := <-tick.C:
			var expired []*heldPermit
			s.mu.Lock()
			for id, hp := range s.permits {
				if now.After(hp.expires) {
					expired = append(expired, hp)
					delete(s.permits, id)
				}
			}
			for id, hr := range s.reservations {
				if now.After(hr.expires) {
					delete(s.reservations, id)
				}
			}
			s.mu.Unlock()
			for _, hp := range expired {
				hp.p.Release(context.Background())
			}
		}
	}
}

// handler routes the API (docs/sidecar.md).
func (s *sidecar) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /metrics", s.auth(s.metrics))
	mux.HandleFunc("POST /v1/buckets/{name}/enter", s.auth(s.enter))
	mux.HandleFunc("POST /v1/buckets/{name}/reserve", s.auth(s.reserve))
	mux.HandleFunc("POST /v1/buckets/{name}/settle", s.auth(s.settle))
	mux.HandleFunc("POST /v1/buckets/{name}/cancel", s.auth(s.cancel))
	mux.HandleFunc("POST /v1/buckets/{name}/estimate", s.auth(s.estimate))
	mux.HandleFunc("GET /v1/buckets/{name}", s.auth(s.inspectBucket))
	mux.HandleFunc("POST /v1/semaphores/{name}/acquire", s.auth(s.acquire))
	mux.HandleFunc("POST /v1/semaphores/{name}/renew", s.auth(s.renew))
	mux.HandleFunc("POST /v1/semaphores/{name}/release", s.auth(s.release))
	mux.HandleFunc("GET /v1/semaphores/{name}", s.auth(s.inspectSemaphore))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		fail(w, http.StatusNotFound, "no endpoint %s %s (docs/sidecar.md lists them)", r.Method, r.URL.Path)
	})
	return mux
}

// auth checks the bearer token, when the server has one.
func (s *sidecar) auth(h http.HandlerFunc) http.HandlerFunc {
	if s.opt.token == "" {
		return h
	}
	want := []byte("Bearer " + s.opt.token)
	return func(w http.ResponseWriter, r *http.Request) {
		if subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), want) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
			fail(w, http.StatusUnauthorized, "missing or wrong bearer token (Authorization: Bearer <the --token-file's token>)")
			return
		}
		h(w, r)
	}
}

func (s *sidecar) healthz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), time.Second)
	defer cancel()
	if err := s.rdb.Ping(ctx).Err(); err != nil {
		fail(w, http.StatusServiceUnavailable, "Redis at %s does not answer a PING within 1s: %v", s.opt.addr, err)
		return
	}
	reply(w, http.StatusOK, map[string]string{"status": "ok"})
}

// apiError is every error reply's body: the error in words, and its
// reason as a word a client can switch on.
type apiError struct {
	Error  string `json:"error"`
	Reason string `json:"reason"`
	// RetryAfterMS is, for wait_too_long, how long until the caller's
	// earliest turn.
	RetryAfterMS int64 `json:"retry_after_ms,omitempty"`
}

// Reasons of apiError.
const (
	reasonWaitTooLong = "wait_too_long" // 429: not granted within timeout_ms
	reasonQueueFull   = "queue_full"    // 429: MaxQueue or --max-waiting callers already wait
)

// reasons are the other errors' reasons, by status.
var reasons = map[int]string{
	http.StatusBadRequest:            "bad_request",
	http.StatusUnauthorized:          "unauthorized",
	http.StatusNotFound:              "not_found",
	http.StatusConflict:              "config_mismatch",
	http.StatusGone:                  "lease_lost",
	http.StatusRequestEntityTooLarge: "too_large",
	http.StatusInternalServerError:   "internal",
	http.StatusServiceUnavailable:    "unavailable",
}

func reply(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(v)
}

func fail(w http.ResponseWriter, code int, format string, a ...any) {
	reply(w, code, apiError{Error: fmt.Sprintf(format, a...), Reason: reasons[code]})
}

// refuse answers 429 for reason, with when the caller may try again, if
// known.
func refuse(w http.ResponseWriter, reason string, retryAfter time.Duration, format string, a ...any) {
	e := apiError{Error: fmt.Sprintf(format, a...), Reason: reason}
	if retryAfter > 0 {
		e.RetryAfterMS = int64(math.Ceil(float64(retryAfter) / float64(time.Millisecond)))
		w.Header().Set("Retry-After", strconv.FormatInt(int64(math.Ceil(retryAfter.Seconds())), 10))
	}
	reply(w, http.StatusTooManyRequests, e)
}

// decode reads the request's JSON body into v; an empty body leaves v as
// it is. It answers and returns false when the body is too large or not
// the JSON expected.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			fail(w, http.StatusRequestEntityTooLarge, "request body above %d bytes", maxBody)
		} else {
			fail(w, http.StatusBadRequest, "reading the request body: %v", err)
		}
		return false
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return true
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		fail(w, http.StatusBadRequest, "request body is not the JSON expected: %v", err)
		return false
	}
	if dec.More() {
		fail(w, http.StatusBadRequest, "request body has more than one JSON value")
		return false
	}
	return true
}

// timeout reads timeout_ms: 0 waits as long as needed.
func timeout(w http.ResponseWriter, ms int64) (time.Duration, bool) {
	if ms < 0 || ms > int64(24*time.Hour/time.Millisecond) {
		fail(w, http.StatusBadRequest, "timeout_ms %d, want 0 (no timeout) to %d", ms, int64(24*time.Hour/time.Millisecond))
		return 0, false
	}
	return time.Duration(ms) * time.Millisecond, true
}

// withTimeout is ctx bounded by d, unless d is 0.
func withTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d == 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}

// bucketOf returns the handle on the path's bucket: the one --config
// names, or else one that follows the policies Redis stores. It answers
// and returns nil when the name is invalid or the bucket unknown.
func (s *sidecar) bucketOf(w http.ResponseWriter, r *http.Request) *servedBucket {
	name := r.PathValue("name")
	if err := checkName(name); err != nil {
		fail(w, http.StatusBadRequest, "bucket name %q: %v", name, err)
		return nil
	}
	s.mu.Lock()
	sb, closed := s.buckets[name], s.closed
	s.mu.Unlock()
	switch {
	case closed:
		fail(w, http.StatusServiceUnavailable, "the server is shutting down")
		return nil
	case sb != nil:
		return sb
	}
	// Not configured: read what Redis stores through a handle that stores
	// nothing (Inspect only reads), then serve with those policies, so that
	// the bucket's state expiring later stores them again, never a
	// placeholder.
	ctx, cancel := context.WithTimeout(r.Context(), callTimeout)
	defer cancel()
	probe, err := bucket.New(s.rdb, bucket.Config{Name: name, KeyPrefix: s.opt.prefix, Policies: placeholder, Adopt: true})
	if err != nil {
		fail(w, http.StatusBadRequest, "bucket %q: %v", name, err)
		return nil
	}
	in, err := probe.Inspect(ctx)
	probe.Close()
	switch {
	case err != nil:
		s.failed(w, r, name, err)
		return nil
	case !in.Stored:
		fail(w, http.StatusNotFound, "bucket %q: unknown: not in --config, and %s", name, noConfig)
		return nil
	}
	b, err := bucket.New(s.rdb, bucket.Config{Name: name, KeyPrefix: s.opt.prefix, Policies: in.Policies, Adopt: true, Observer: s.observer})
	if err != nil {
		fail(w, http.StatusInternalServerError, "bucket %q: the policies stored: %v", name, err)
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		b.Close()
		fail(w, http.StatusServiceUnavailable, "the server is shutting down")
		return nil
	}
	if sb := s.buckets[name]; sb != nil { // another request made it first
		b.Close()
		return sb
	}
	sb = &servedBucket{b: b}
	s.buckets[name] = sb
	return sb
}

// failed answers a call of the library that failed for a reason that is
// not the request's: the server stopping, the client gone, Redis.
func (s *sidecar) failed(w http.ResponseWriter, r *http.Request, name string, err error) {
	switch {
	case s.stopping.Err() != nil || errors.Is(err, sl.ErrClosed):
		fail(w, http.StatusServiceUnavailable, "%q: the server is shutting down", name)
	case r.Context().Err() != nil:
		// The client went away: nobody reads the answer.
	default:
		fail(w, http.StatusServiceUnavailable, "%q: %v", name, err)
	}
}

// costRequest is the body of enter, reserve and estimate.
type costRequest struct {
	// Cost by unit; absent means one call ({"": 1}).
	Cost      bucket.Cost `json:"cost"`
	TimeoutMS int64       `json:"timeout_ms"`
}

func (c costRequest) cost() bucket.Cost {
	if c.Cost == nil {
		return bucket.Cost{"": 1}
	}
	return c.Cost
}

// grantReply is enter's and reserve's answer.
type grantReply struct {
	// Reservation is reserve's id, for settle and cancel.
	Reservation string  `json:"reservation,omitempty"`
	WaitedMS    float64 `json:"waited_ms"`
	// Ticket is the caller's arrival order at Redis among the bucket's
	// callers (bucket.Report.Ticket); 0 when it did not queue.
	Ticket int64 `json:"ticket"`
	// Detail is for cmd/bench only (envDetail).
	Detail *grantDetail `json:"detail,omitempty"`
}

// grantDetail is what cmd/bench needs of a grant to judge it as it judges
// the library's: its slot on the Redis clock and how it got it.
type grantDetail struct {
	SlotUS    int64 `json:"slot_us"` // unix µs, Redis clock
	Position  int   `json:"position"`
	Polls     int   `json:"polls"`
	Retimes   int   `json:"retimes"`
	Reentries int   `json:"reentries"`
	LateNS    int64 `json:"late_ns"`
}

func (s *sidecar) enter(w http.ResponseWriter, r *http.Request)   { s.grant(w, r, false) }
func (s *sidecar) reserve(w http.ResponseWriter, r *http.Request) { s.grant(w, r, true) }

// grant is enter and reserve: the caller waits its turn in the bucket.
func (s *sidecar) grant(w http.ResponseWriter, r *http.Request, reserve bool) {
	var req costRequest
	if !decode(w, r, &req) {
		return
	}
	d, ok := timeout(w, req.TimeoutMS)
	if !ok {
		return
	}
	sb := s.bucketOf(w, r)
	if sb == nil {
		return
	}
	name := r.PathValue("name")
	if n := sb.waiting.Add(1); n > int64(s.opt.maxWaiting) {
		sb.waiting.Add(-1)
		refuse(w, reasonQueueFull, 0, "bucket %q: %d callers already wait at this server (--max-waiting)", name, s.opt.maxWaiting)
		return
	}
	defer sb.waiting.Add(-1)
	ctx, cancel := withTimeout(r.Context(), d)
	defer cancel()
	var detail enterdetail.Detail
	if s.opt.granted != nil || s.opt.detail {
		ctx = enterdetail.With(ctx, &detail)
	}
	cost := req.cost()
	if msg := badCost(ctx, sb.b, cost); msg != "" {
		fail(w, http.StatusBadRequest, "bucket %q: %s", name, msg)
		return
	}
	var (
		rep bucket.Report
		res *bucket.Reservation
		err error
	)
	if reserve {
		if res, err = sb.b.Reserve(ctx, cost); err == nil {
			rep = res.Report()
		}
	} else {
		rep, err = sb.b.EnterReport(ctx, cost)
	}
	if err != nil {
		s.refused(w, r, name, d, err)
		return
	}
	if reserve && r.Context().Err() != nil { // granted as the client left: nobody will settle it
		res.Cancel(context.WithoutCancel(ctx))
		return
	}
	if s.opt.granted != nil {
		s.opt.granted(name, detail.Slot, rep, cost)
	}
	out := grantReply{WaitedMS: float64(rep.Wait.Microseconds()) / 1000, Ticket: rep.Ticket}
	if s.opt.detail {
		out.Detail = &grantDetail{SlotUS: detail.Slot.UnixMicro(), Position: rep.Position, Polls: detail.Polls,
			Retimes: rep.Retimes, Reentries: rep.Reentries, LateNS: int64(rep.Late)}
	}
	if reserve {
		out.Reservation = newID()
		s.mu.Lock()
		s.reservations[out.Reservation] = &heldReservation{bucket: name, r: res, expires: time.Now().Add(sb.b.Config().ReservationTTL)}
		s.mu.Unlock()
	}
	reply(w, http.StatusOK, out)
}

// refused answers an enter, reserve or acquire that failed.
func (s *sidecar) refused(w http.ResponseWriter, r *http.Request, name string, d time.Duration, err error) {
	var tooLong *sl.WaitTooLongError
	var mismatch *sl.ConfigMismatchError
	switch {
	case errors.As(err, &tooLong):
		refuse(w, reasonWaitTooLong, tooLong.Wait, "%q: not granted within timeout_ms: the earliest turn is %v away, timeout %v", name, tooLong.Wait.Round(time.Millisecond), tooLong.Limit)
	case errors.Is(err, sl.ErrQueueFull):
		refuse(w, reasonQueueFull, 0, "%q: %v", name, err)
	case errors.Is(err, sl.ErrCostExceedsCapacity):
		fail(w, http.StatusBadRequest, "%q: %v", name, err)
	case errors.As(err, &mismatch):
		fail(w, http.StatusConflict, "%q: %v", name, err)
	case errors.Is(err, sl.ErrConfig):
		fail(w, http.StatusBadRequest, "%q: %v", name, err)
	case s.stopping.Err() == nil && r.Context().Err() == nil && errors.Is(err, context.DeadlineExceeded):
		refuse(w, reasonWaitTooLong, 0, "%q: not granted within timeout_ms (%v)", name, d)
	default:
		s.failed(w, r, name, err)
	}
}

// badCost says what is wrong with cost c for bucket b, or "" when
// nothing is. The library refuses such a cost too, but with an error no
// sentinel marks (it could not be told from Redis's), so the server
// checks first: a negative cost, or a unit no policy in force counts.
func badCost(ctx context.Context, b *bucket.Bucket, c bucket.Cost) string {
	counts := func(ps []bucket.Policy, unit string) bool {
		for _, p := range ps {
			if p.Unit == unit {
				return true
			}
		}
		return false
	}
	var inForce []bucket.Policy
	for unit, n := range c {
		if n < 0 {
			return fmt.Sprintf("negative cost %d of unit %q", n, unit)
		}
		if counts(b.Config().Policies, unit) {
			continue
		}
		if inForce == nil { // the policies may have changed since: ask Redis
			ps, err := b.Policies(ctx)
			if err != nil {
				return ""
			}
			inForce = ps
		}
		if !counts(inForce, unit) {
			return fmt.Sprintf("cost of unit %q, which no policy of the bucket counts", unit)
		}
	}
	return ""
}

// newID is a reservation's or a permit's id: random, so that a client
// cannot settle or release another's by guessing.
func newID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// settleRequest is the body of settle and cancel.
type settleRequest struct {
	Reservation string `json:"reservation"`
	// Cost is settle's true cost; a unit it does not name is charged at
	// the estimate.
	Cost bucket.Cost `json:"cost"`
}

func (s *sidecar) settle(w http.ResponseWriter, r *http.Request) { s.finish(w, r, true) }
func (s *sidecar) cancel(w http.ResponseWriter, r *http.Request) { s.finish(w, r, false) }

// finish is settle and cancel.
func (s *sidecar) finish(w http.ResponseWriter, r *http.Request, settle bool) {
	var req settleRequest
	if !decode(w, r, &req) {
		return
	}
	name := r.PathValue("name")
	if req.Reservation == "" {
		fail(w, http.StatusBadRequest, "no reservation given (the id reserve answered)")
		return
	}
	s.mu.Lock()
	hr := s.reservations[req.Reservation]
	s.mu.Unlock()
	if hr == nil || hr.bucket != name {
		fail(w, http.StatusNotFound, "bucket %q: no open reservation %q (settled, cancelled, expired, or reserved from another server)", name, req.Reservation)
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), callTimeout)
	defer cancel()
	s.mu.Lock()
	sb := s.buckets[name]
	s.mu.Unlock()
	if sb != nil {
		if msg := badCost(ctx, sb.b, req.Cost); msg != "" {
			fail(w, http.StatusBadRequest, "bucket %q: %s", name, msg)
			return
		}
	}
	var err error
	if settle {
		err = hr.r.Settle(ctx, req.Cost)
	} else {
		err = hr.r.Cancel(ctx)
	}
	switch {
	case err == nil || errors.Is(err, bucket.ErrReservationSettled):
		s.mu.Lock()
		delete(s.reservations, req.Reservation)
		s.mu.Unlock()
		if err != nil {
			fail(w, http.StatusConflict, "bucket %q: %v", name, err)
			return
		}
		reply(w, http.StatusOK, struct{}{})
	case errors.Is(err, sl.ErrConfig):
		fail(w, http.StatusBadRequest, "bucket %q: %v", name, err)
	default:
		fail(w, http.StatusServiceUnavailable, "bucket %q: %v (the reservation stays open: try again)", name, err)
	}
}

// estimateReply is estimate's answer.
type estimateReply struct {
	WaitMS float64 `json:"wait_ms"`
	Ahead  int     `json:"ahead"`
}

func (s *sidecar) estimate(w http.ResponseWriter, r *http.Request) {
	var req costRequest
	if !decode(w, r, &req) {
		return
	}
	sb := s.bucketOf(w, r)
	if sb == nil {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), callTimeout)
	defer cancel()
	if msg := badCost(ctx, sb.b, req.cost()); msg != "" {
		fail(w, http.StatusBadRequest, "bucket %q: %s", r.PathValue("name"), msg)
		return
	}
	est, err := sb.b.Estimate(ctx, req.cost())
	switch {
	case errors.Is(err, sl.ErrCostExceedsCapacity) || errors.Is(err, sl.ErrConfig):
		fail(w, http.StatusBadRequest, "%q: %v", r.PathValue("name"), err)
	case err != nil:
		s.failed(w, r, r.PathValue("name"), err)
	default:
		reply(w, http.StatusOK, estimateReply{WaitMS: float64(est.Wait.Microseconds()) / 1000, Ahead: est.Ahead})
	}
}

// inspectBucket answers as `sluice inspect --json`.
func (s *sidecar) inspectBucket(w http.ResponseWriter, r *http.Request) {
	sb := s.bucketOf(w, r)
	if sb == nil {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), callTimeout)
	defer cancel()
	in, err := sb.b.Inspect(ctx)
	if err != nil {
		s.failed(w, r, r.PathValue("name"), err)
		return
	}
	reply(w, http.StatusOK, newReport(r.PathValue("name"), s.opt.prefix, in))
}

// semaphoreOf is bucketOf for semaphores.
func (s *sidecar) semaphoreOf(w http.ResponseWriter, r *http.Request) *servedSemaphore {
	name := r.PathValue("name")
	if err := checkName(name); err != nil {
		fail(w, http.StatusBadRequest, "semaphore name %q: %v", name, err)
		return nil
	}
	s.mu.Lock()
	ss, closed := s.semaphores[name], s.closed
	s.mu.Unlock()
	switch {
	case closed:
		fail(w, http.StatusServiceUnavailable, "the server is shutting down")
		return nil
	case ss != nil:
		return ss
	}
	ctx, cancel := context.WithTimeout(r.Context(), callTimeout)
	defer cancel()
	probe, err := semaphore.New(s.rdb, semaphore.Config{Name: name, KeyPrefix: s.opt.prefix, Capacity: 1, Adopt: true})
	if err != nil {
		fail(w, http.StatusBadRequest, "semaphore %q: %v", name, err)
		return nil
	}
	in, err := probe.Inspect(ctx)
	probe.Close()
	switch {
	case err != nil:
		s.failed(w, r, name, err)
		return nil
	case !in.Stored:
		fail(w, http.StatusNotFound, "semaphore %q: unknown: not in --config, and no capacity stored: it was never used, or idle for a week", name)
		return nil
	}
	sem, err := semaphore.New(s.rdb, semaphore.Config{Name: name, KeyPrefix: s.opt.prefix, Capacity: in.Capacity, Adopt: true, Observer: s.observer})
	if err != nil {
		fail(w, http.StatusInternalServerError, "semaphore %q: the capacity stored: %v", name, err)
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		sem.Close()
		fail(w, http.StatusServiceUnavailable, "the server is shutting down")
		return nil
	}
	if ss := s.semaphores[name]; ss != nil {
		sem.Close()
		return ss
	}
	ss = &servedSemaphore{s: sem}
	s.semaphores[name] = ss
	return ss
}

// acquireRequest is acquire's body.
type acquireRequest struct {
	// Weight of the permit; 0 means 1.
	Weight    int   `json:"weight"`
	TimeoutMS int64 `json:"timeout_ms"`
}

// permitReply is acquire's and renew's answer: the permit stays held
// while its client renews it within LeaseMS.
type permitReply struct {
	Permit   string  `json:"permit"`
	LeaseMS  int64   `json:"lease_ms"`
	WaitedMS float64 `json:"waited_ms,omitempty"`
}

func (s *sidecar) acquire(w http.ResponseWriter, r *http.Request) {
	var req acquireRequest
	if !decode(w, r, &req) {
		return
	}
	d, ok := timeout(w, req.TimeoutMS)
	if !ok {
		return
	}
	if req.Weight < 0 {
		fail(w, http.StatusBadRequest, "weight %d, want ≥ 1 (0 means 1)", req.Weight)
		return
	}
	ss := s.semaphoreOf(w, r)
	if ss == nil {
		return
	}
	name := r.PathValue("name")
	if n := ss.waiting.Add(1); n > int64(s.opt.maxWaiting) {
		ss.waiting.Add(-1)
		refuse(w, reasonQueueFull, 0, "semaphore %q: %d callers already wait at this server (--max-waiting)", name, s.opt.maxWaiting)
		return
	}
	defer ss.waiting.Add(-1)
	ctx, cancel := withTimeout(r.Context(), d)
	defer cancel()
	start := time.Now()
	p, err := ss.s.AcquireN(ctx, max(req.Weight, 1))
	if err != nil {
		s.refused(w, r, name, d, err)
		return
	}
	if r.Context().Err() != nil { // granted as the client left
		p.Release(context.Background())
		return
	}
	id := newID()
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		p.Release(context.Background())
		fail(w, http.StatusServiceUnavailable, "%q: the server is shutting down", name)
		return
	}
	s.permits[id] = &heldPermit{semaphore: name, p: p, expires: time.Now().Add(s.opt.lease)}
	s.mu.Unlock()
	reply(w, http.StatusOK, permitReply{Permit: id, LeaseMS: s.opt.lease.Milliseconds(), WaitedMS: float64(time.Since(start).Microseconds()) / 1000})
}

// permitRequest is the body of renew and release.
type permitRequest struct {
	Permit string `json:"permit"`
}

// heldPermitOf returns the permit the body names, or answers 404.
func (s *sidecar) heldPermitOf(w http.ResponseWriter, r *http.Request) (string, *heldPermit) {
	var req permitRequest
	if !decode(w, r, &req) {
		return "", nil
	}
	name := r.PathValue("name")
	if req.Permit == "" {
		fail(w, http.StatusBadRequest, "no permit given (the id acquire answered)")
		return "", nil
	}
	s.mu.Lock()
	hp := s.permits[req.Permit]
	s.mu.Unlock()
	if hp == nil || hp.semaphore != name {
		fail(w, http.StatusNotFound, "semaphore %q: no permit %q held (released, or not renewed within its lease)", name, req.Permit)
		return "", nil
	}
	return req.Permit, hp
}

func (s *sidecar) renew(w http.ResponseWriter, r *http.Request) {
	id, hp := s.heldPermitOf(w, r)
	if hp == nil {
		return
	}
	select {
	case <-hp.p.Lost():
		s.mu.Lock()
		delete(s.permits, id)
		s.mu.Unlock()
		fail(w, http.StatusGone, "semaphore %q: %v: another caller may hold the place now", hp.semaphore, semaphore.ErrLeaseLost)
		return
	default:
	}
	s.mu.Lock()
	hp.expires = time.Now().Add(s.opt.lease)
	s.mu.Unlock()
	reply(w, http.StatusOK, permitReply{Permit: id, LeaseMS: s.opt.lease.Milliseconds()})
}

func (s *sidecar) release(w http.ResponseWriter, r *http.Request) {
	id, hp := s.heldPermitOf(w, r)
	if hp == nil {
		return
	}
	s.mu.Lock()
	_, held := s.permits[id]
	delete(s.permits, id)
	s.mu.Unlock()
	if !held { // another release took it first
		fail(w, http.StatusNotFound, "semaphore %q: no permit %q held (released)", hp.semaphore, id)
		return
	}
	if err := hp.p.Release(r.Context()); err != nil {
		fail(w, http.StatusGone, "semaphore %q: %v", hp.semaphore, err)
		return
	}
	reply(w, http.StatusOK, struct{}{})
}

// semaphoreReport is GET /v1/semaphores/{name}.
type semaphoreReport struct {
	Semaphore string    `json:"semaphore"`
	Prefix    string    `json:"prefix"`
	Now       time.Time `json:"now"`
	Capacity  int       `json:"capacity"`
	Held      int       `json:"held"`
	Holders   int       `json:"holders"`
	Queued    int       `json:"queued"`
	Expired   int       `json:"expired"`
}

func (s *sidecar) inspectSemaphore(w http.ResponseWriter, r *http.Request) {
	ss := s.semaphoreOf(w, r)
	if ss == nil {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), callTimeout)
	defer cancel()
	in, err := ss.s.Inspect(ctx)
	if err != nil {
		s.failed(w, r, r.PathValue("name"), err)
		return
	}
	reply(w, http.StatusOK, semaphoreReport{
		Semaphore: r.PathValue("name"), Prefix: s.opt.prefix, Now: in.Now.UTC(),
		Capacity: in.Capacity, Held: in.Held, Holders: in.Holders, Queued: in.Queued, Expired: in.Expired,
	})
}
