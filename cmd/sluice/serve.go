package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"runtime"
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
	procs := fs.Int("procs", 1, "how many `N` threads run the server's Go code at once (GOMAXPROCS); 0: Go's default, one per CPU.\n"+
		"1 (unless GOMAXPROCS is set) fits a sidecar per host: a call answers sooner on one thread than handed between two;\n"+
		"a server for a fleet wants more (docs/sidecar.md)")
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
	if *procs < 0 {
		return usagef("serve: --procs %d, want ≥ 0 (0: one per CPU)", *procs)
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
	if given(fs, "procs") || os.Getenv("GOMAXPROCS") == "" {
		setProcs(*procs)
	}
	fmt.Fprintf(stdout, "sluice serve: listening on http://%s (Redis at %s, prefix %q)\n", ln.Addr(), t.addr, t.prefix)
	err = s.serve(ctx, ln)
	fmt.Fprintln(stdout, "sluice serve: stopped")
	return err
}

// setProcs applies --procs: GOMAXPROCS n, or Go's default for 0. The
// tests, which run serve in their own process, replace it.
var setProcs = func(n int) {
	if n == 0 {
		runtime.SetDefaultGOMAXPROCS()
		return
	}
	runtime.GOMAXPROCS(n)
}

// given says whether flag name was on the command line.
func given(fs *flag.FlagSet, name string) bool {
	found := false
	fs.Visit(func(f *flag.Flag) { found = found || f.Name == name })
	return found
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
	// its detail (its slot on the Redis clock, its claims: tests judge
	// them with the checker).
	granted func(name string, d enterdetail.Detail, rep bucket.Report, c bucket.Cost)
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
	buckets      map[string]*served[*bucket.Bucket]
	semaphores   map[string]*served[*semaphore.Semaphore]
	reservations map[string]*heldReservation
	permits      map[string]*heldPermit
	closed       bool
}

// served is the handle the server keeps for a bucket's or a
// semaphore's name, shared by all its callers.
type served[L limiter] struct {
	l L
	// waiting counts the callers waiting on it here, for --max-waiting.
	waiting atomic.Int64
	seen    seen // for /metrics
}

// limiter is what the server keeps a handle on: a *bucket.Bucket or a
// *semaphore.Semaphore.
type limiter interface {
	Stats() sl.Stats
	Close() error
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
		buckets:      map[string]*served[*bucket.Bucket]{},
		semaphores:   map[string]*served[*semaphore.Semaphore]{},
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
		s.buckets[name] = &served[*bucket.Bucket]{l: b}
	}
	for name, sc := range opt.config.Semaphores {
		sem, err := semaphore.New(rdb, semaphore.Config{Name: name, KeyPrefix: opt.prefix, Capacity: sc.Capacity, Observer: s.observer})
		if err != nil {
			s.closeHandles()
			return nil, fmt.Errorf("--config: semaphore %q: %w", name, err)
		}
		s.semaphores[name] = &served[*semaphore.Semaphore]{l: sem}
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
		sb.l.Close()
	}
	for _, ss := range s.semaphores {
		ss.l.Close()
	}
	clear(s.buckets) // not new maps: servedOf is handed these
	clear(s.semaphores)
}

// servedOf returns the handle on the path's name in handles (s.buckets
// or s.semaphores): the one --config names or an earlier request opened,
// or else the one adopt opens, which follows the limits Redis stores and
// is kept for the next requests. It answers and returns nil when the name
// is invalid, adopt fails (an *answerError is answered as it says, any
// other error as Redis's) or the server is shutting down.
func servedOf[L limiter](s *sidecar, w http.ResponseWriter, r *http.Request, kind string, handles map[string]*served[L], adopt func(context.Context, string) (L, error)) *served[L] {
	name := r.PathValue("name")
	if err := checkName(name); err != nil {
		fail(w, http.StatusBadRequest, "%s name %q: %v", kind, name, err)
		return nil
	}
	s.mu.Lock()
	h, closed := handles[name], s.closed
	s.mu.Unlock()
	switch {
	case closed:
		fail(w, http.StatusServiceUnavailable, "the server is shutting down")
		return nil
	case h != nil:
		return h
	}
	ctx, cancel := context.WithTimeout(r.Context(), callTimeout)
	defer cancel()
	l, err := adopt(ctx, name)
	if ae, ok := errors.AsType[*answerError](err); ok {
		fail(w, ae.code, "%s", ae.msg)
		return nil
	} else if err != nil {
		s.failed(w, r, name, err)
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		l.Close()
		fail(w, http.StatusServiceUnavailable, "the server is shutting down")
		return nil
	}
	if h := handles[name]; h != nil { // another request made it first
		l.Close()
		return h
	}
	h = &served[L]{l: l}
	handles[name] = h
	return h
}

// answerError is an error to answer with its status and words as they
// are.
type answerError struct {
	code int
	msg  string
}

func (e *answerError) Error() string { return e.msg }

func answer(code int, format string, a ...any) error {
	return &answerError{code: code, msg: fmt.Sprintf(format, a...)}
}

// waitIn is what every request that waits in a limiter does once its
// body is decoded: its timeout (timeoutMS), the handle (look), a place
// among the callers waiting here (admit), and the ctx the wait runs
// under. ok false: the reply is written. Otherwise the request defers
// leave, which gives the place back and ends ctx.
func waitIn[L limiter](s *sidecar, w http.ResponseWriter, r *http.Request, kind string, timeoutMS int64, look func(http.ResponseWriter, *http.Request) *served[L]) (h *served[L], ctx context.Context, d time.Duration, leave func(), ok bool) {
	if d, ok = timeout(w, timeoutMS); !ok {
		return nil, nil, 0, nil, false
	}
	if h = look(w, r); h == nil {
		return nil, nil, 0, nil, false
	}
	if !s.admit(w, kind, r.PathValue("name"), &h.waiting) {
		return nil, nil, 0, nil, false
	}
	ctx, cancel := withTimeout(r.Context(), d)
	return h, ctx, d, func() { cancel(); h.waiting.Add(-1) }, true
}

// admit counts one more caller waiting at this server on the limiter
// whose waiting callers are *waiting; beyond --max-waiting it answers 429
// and returns false. The caller that was admitted counts itself out when
// it returns.
func (s *sidecar) admit(w http.ResponseWriter, kind, name string, waiting *atomic.Int64) bool {
	if n := waiting.Add(1); n > int64(s.opt.maxWaiting) {
		waiting.Add(-1)
		refuse(w, reasonQueueFull, 0, "%s %q: %d callers already wait at this server (--max-waiting)", kind, name, s.opt.maxWaiting)
		return false
	}
	return true
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

// newID is a reservation's or a permit's id: random, so that a client
// cannot settle or release another's by guessing.
func newID() string {
	var b [16]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
