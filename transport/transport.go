// Package transport is an http.RoundTripper that enters a limiter before
// each request and steers it with what the upstream answers.
//
// Wrap any client's transport with New, or take a ready *http.Client from
// NewClient. Before each request the Transport enters the limiter (any
// sluice.Limiter: a bucket.Bucket shared by every process, or an in-process
// local.Rate); after it, it reads the answer with package upstream and, when
// the limiter is an upstream.Receiver, hands it the Signal with Feedback, so
// a 429 with Retry-After holds every caller, not only this one. A request
// the upstream refused for its limit (a 429, a 503 with Retry-After, a 403
// with Retry-After or an exhausted quota) is sent again after entering
// again, a bounded number of times. With WithReserve it reserves each
// request's estimated cost instead, and settles it with the usage the
// response reports (an LLM API's tokens). See docs/upstream.md.
package transport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice"
	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/configerr"
	"github.com/sluicehq/sluice/upstream"
)

// errConfig is returned by RoundTrip when the options ask what the limiter
// cannot do: a cost other than 0 or 1 for a limiter with no EnterN. It
// matches sluice.ErrConfig.
var errConfig = configerr.New("transport")

// defaultRetries is how many times a refused request is sent again unless
// WithRetries says otherwise.
const defaultRetries = 2

// drainLimit is how much of a refused response's body is read so that its
// connection can be reused; a longer body is closed unread.
const drainLimit = 64 << 10

// warnEvery is how often, at most, the Logger is told of one unreadable
// header: every response of a busy client carries it, and one line a
// minute says it without flooding the log.
const warnEvery = time.Minute

// Transport is an http.RoundTripper that enters a limiter before each
// request (see the package comment). Create one with New; the zero value is
// not usable. A Transport is safe for concurrent use, as its base and
// limiter are.
type Transport struct {
	base    http.RoundTripper
	lim     sluice.Limiter
	recv    upstream.Receiver // lim, when it is one
	cost    func(*http.Request) int
	enter   func(context.Context, *http.Request) error
	reserve *reserving // WithReserve
	headers upstream.Headers
	retries int
	logger  *slog.Logger
	warned  warnClock
}

// Option configures a Transport.
type Option func(*Transport)

// WithCost sets the cost of each request, in calls: the Transport enters
// with EnterN(ctx, cost(req)) when the limiter has EnterN (bucket.Bucket,
// local.Rate and local.Noop have it). A cost of 0 enters nothing. A
// limiter without EnterN takes only costs 0 and 1; RoundTrip refuses any
// other with an error matching sluice.ErrConfig. Without WithCost every request
// costs one call. cost is called once per attempt, with the request as it
// is sent.
func WithCost(cost func(req *http.Request) int) Option {
	return func(t *Transport) { t.cost = cost }
}

// WithEnter replaces the way the Transport enters the limiter: it calls
// enter before each attempt and sends the request when enter returns nil.
// Use it for costs in several units, such as a bucket's processing units:
//
//	transport.WithEnter(func(ctx context.Context, req *http.Request) error {
//		return b.EnterCost(ctx, bucket.Cost{"": 1, "pu": puOf(req)})
//	})
//
// The limiter given to New still receives the Feedback. WithEnter overrides
// WithCost.
func WithEnter(enter func(ctx context.Context, req *http.Request) error) Option {
	return func(t *Transport) { t.enter = enter }
}

// WithHeaders sets the headers read from each response; upstream.Default
// without it.
func WithHeaders(h upstream.Headers) Option {
	return func(t *Transport) { t.headers = h }
}

// WithLogger sets where the Transport tells an operator what they must
// know: a header the upstream sent, among those WithHeaders names, with a
// value that cannot be read (upstream.Signal.Unreadable; the Transport
// reads it as not said), logged at Warn with the request's host, the
// status, the header's name and value, at most once a minute for each
// header name. Without it, or with nil, nothing is logged.
func WithLogger(l *slog.Logger) Option {
	return func(t *Transport) { t.logger = l }
}

// WithRetries sets how many times a refused request is sent again, each
// time after entering again; 0 never sends it again, and a negative n is
// read as 0. Without it, 2.
func WithRetries(n int) Option {
	return func(t *Transport) { t.retries = max(n, 0) }
}

// New returns a Transport that sends through base (http.DefaultTransport
// when base is nil) within lim.
func New(base http.RoundTripper, lim sluice.Limiter, opts ...Option) *Transport {
	if base == nil {
		base = http.DefaultTransport
	}
	t := &Transport{base: base, lim: lim, headers: upstream.Default, retries: defaultRetries}
	t.recv, _ = lim.(upstream.Receiver)
	for _, o := range opts {
		o(t)
	}
	return t
}

// NewClient returns an *http.Client whose requests go through a Transport
// on http.DefaultTransport within lim.
func NewClient(lim sluice.Limiter, opts ...Option) *http.Client {
	return &http.Client{Transport: New(nil, lim, opts...)}
}

// RoundTrip enters the limiter, sends req through the base transport, and
// feeds what the response says back to the limiter when it is an
// upstream.Receiver (its error ignored: the response is still good, and the
// Transport then waits out Retry-After itself).
//
// A refused response is sent again, after entering again, at most the
// retry count of times, unless:
//   - the request's body cannot be replayed (Body set and GetBody nil),
//   - the request's context has a deadline before the end of the wait the
//     upstream asked for: the refused response is returned as it is.
//
// Before sending again, the Transport reads and closes the refused
// response's body, and waits out the upstream's Retry-After (or the reset
// of a quota it reported exhausted) when the limiter is not a Receiver; a
// Receiver's hold makes the next entering wait instead. The last refused
// response, when retries run out, is returned as it is.
//
// RoundTrip returns the limiter's error, without sending, when it cannot
// enter (an error matching ctx.Err() when the request's context ends
// first), and the base transport's errors as they are. It never modifies
// req: a request sent again is a clone with a fresh body from GetBody.
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	replayable := req.Body == nil || req.Body == http.NoBody || req.GetBody != nil
	for attempt := 0; ; attempt++ {
		r := req
		if attempt > 0 {
			r = req.Clone(ctx)
			if req.Body != nil && req.Body != http.NoBody {
				body, err := req.GetBody()
				if err != nil {
					return nil, fmt.Errorf("transport: replaying the request body: %w", err)
				}
				r.Body = body
			}
		}
		resp, res, err := t.send(ctx, r)
		if err != nil {
			return nil, err
		}
		s := t.headers.Parse(resp)
		t.warnUnreadable(ctx, r, s)
		held := false
		if t.recv != nil && (s.Refused || s.RetryAfter > 0 || len(s.Quotas) > 0) {
			held = t.recv.Feedback(ctx, s) == nil
		}
		if res != nil {
			t.settleOn(ctx, r, resp, s, res)
		}
		if !s.Refused || attempt >= t.retries || !replayable {
			return resp, nil
		}
		wait := wait(s)
		if deadline, ok := ctx.Deadline(); ok && time.Until(deadline) < wait {
			return resp, nil
		}
		drain(resp)
		if !held {
			if err := sleep(ctx, wait); err != nil {
				return nil, err
			}
		}
	}
}

// CloseIdleConnections closes the base transport's idle connections, when
// it has such a method (http.Client.CloseIdleConnections calls this).
func (t *Transport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}

// The ways a limiter may be entered, smallest first.
type (
	enterer interface {
		Enter(ctx context.Context) error
	}
	costEnterer interface {
		EnterN(ctx context.Context, n int) error
	}
)

// send enters the limiter (or reserves, with WithReserve: the
// reservation is returned) and sends r. When it does not send, it closes
// r's body, as a RoundTripper must.
func (t *Transport) send(ctx context.Context, r *http.Request) (*http.Response, *bucket.Reservation, error) {
	if t.reserve != nil {
		return t.sendReserved(ctx, r)
	}
	var err error
	switch {
	case t.enter != nil:
		err = t.enter(ctx, r)
	case t.cost != nil:
		err = t.enterCost(ctx, t.cost(r))
	default:
		err = t.enterCost(ctx, 1)
	}
	if err == errUseDo {
		resp, err := t.sendInDo(ctx, r)
		return resp, nil, err
	}
	if err != nil {
		closeBody(r)
		return nil, nil, err
	}
	resp, err := t.base.RoundTrip(r)
	return resp, nil, err
}

// errUseDo tells send that the limiter has only Do.
var errUseDo = errors.New("transport: enter within Do")

func (t *Transport) enterCost(ctx context.Context, n int) error {
	if n == 1 {
		if e, ok := t.lim.(enterer); ok {
			return e.Enter(ctx)
		}
	}
	if e, ok := t.lim.(costEnterer); ok {
		return e.EnterN(ctx, n)
	}
	switch {
	case n == 0:
		return ctx.Err()
	case n == 1:
		return errUseDo
	}
	return configerr.Invalid(errConfig, "cost %d for a limiter (%T) with no EnterN: only 0 and 1 can be entered", n, t.lim)
}

// sendInDo sends r inside the limiter's Do, for a limiter with nothing
// else: a concurrency limiter's place is held until the response's
// headers have come, not until its body is read.
func (t *Transport) sendInDo(ctx context.Context, r *http.Request) (*http.Response, error) {
	var resp *http.Response
	var rtErr error
	sent := false
	err := t.lim.Do(ctx, func(context.Context) error {
		sent = true
		resp, rtErr = t.base.RoundTrip(r)
		return rtErr
	})
	if !sent {
		closeBody(r)
		return nil, err
	}
	return resp, rtErr
}

// warnUnreadable tells the Logger of the headers of s that could not be
// read, each name at most once every warnEvery.
func (t *Transport) warnUnreadable(ctx context.Context, r *http.Request, s upstream.Signal) {
	if t.logger == nil || len(s.Unreadable) == 0 {
		return
	}
	now := time.Now()
	for _, f := range s.Unreadable {
		if t.warned.due(f.Name, now) {
			t.logger.WarnContext(ctx, "sluice: the upstream sent a rate-limit header that cannot be read; it is ignored",
				"host", r.URL.Host, "status", s.Status, "header", f.Name, "value", f.Value)
		}
	}
}

// warnClock remembers when each header name was last logged. Names come
// from the Headers, so the map stays small.
type warnClock struct {
	mu   sync.Mutex
	last map[string]time.Time
}

// due reports whether the header name may be logged now, and if so notes it.
func (c *warnClock) due(name string, now time.Time) bool {
	name = strings.ToLower(name)
	c.mu.Lock()
	defer c.mu.Unlock()
	if last, ok := c.last[name]; ok && now.Sub(last) < warnEvery {
		return false
	}
	if c.last == nil {
		c.last = map[string]time.Time{}
	}
	c.last[name] = now
	return true
}

// wait is how long a client on its own should wait before sending a
// refused request again: the Retry-After, or when there is none, the
// longest reset among the quotas reported exhausted.
func wait(s upstream.Signal) time.Duration {
	if s.RetryAfter > 0 {
		return s.RetryAfter
	}
	var d time.Duration
	for _, q := range s.Quotas {
		if q.Remaining == 0 {
			d = max(d, q.Reset)
		}
	}
	return d
}

func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// drain reads what is left of a response's body, up to drainLimit, and
// closes it, so that its connection can carry the next request.
func drain(resp *http.Response) {
	io.CopyN(io.Discard, resp.Body, drainLimit)
	resp.Body.Close()
}

func closeBody(r *http.Request) {
	if r.Body != nil {
		r.Body.Close()
	}
}
