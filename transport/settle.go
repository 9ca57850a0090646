package transport

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"maps"
	"mime"
	"net/http"
	"sync"
	"time"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/configerr"
	"github.com/sluicehq/sluice/upstream"
)

// settleTimeout bounds each Settle and Cancel the Transport makes: a
// Redis that does not answer delays the response body's Close (or its
// last Read) by at most this long, and the reservation then stays
// counted at its estimate.
const settleTimeout = time.Second

// maxUsageBody is how much of a response body that is not a stream is
// kept, as the caller reads it, to find its usage in: the body of a
// longer one is not read for usage, and its reservation keeps its
// estimate.
const maxUsageBody = 8 << 20

// maxEvent is the longest server-sent event read for usage; a longer one
// is skipped.
const maxEvent = 1 << 20

// Usage reads what a call really cost from its response: doc is one JSON
// document, the whole body of an answer that is not a stream, or the data
// of one server-sent event of a stream (Content-Type text/event-stream),
// each in turn as the caller reads them. Usage writes into seen the cost,
// by unit, that doc reports, replacing what an earlier event of the same
// response said for the units doc names, and reports whether doc carried
// a usage at all. seen starts empty for each response. A Usage must not
// keep doc.
//
// OpenAIUsage and AnthropicUsage read those APIs; another API needs a
// Usage of its own.
type Usage func(doc []byte, seen bucket.Cost) bool

// WithReserve makes the Transport reserve each request's estimated cost
// instead of entering, and settle it with the cost the response says the
// call really had, for a limiter with a Reserve method such as
// *bucket.Bucket: the way to count an LLM API's tokens, whose output is
// known only once the answer is written. estimate gives the cost of the
// request as it is sent (such as Cost{"": 1, "tokens": promptTokens +
// maxTokens}, calls and tokens); it may read the body through
// req.GetBody, never req.Body. usage reads the response body (OpenAIUsage,
// AnthropicUsage, or your own).
//
// Each attempt is a bucket.Reservation:
//
//   - a transport error, or an answer the upstream refused for its limit
//     (upstream.Signal.Refused: a 429, ...) cancels it: the whole estimate
//     goes back to the bucket;
//   - any other answer's body is wrapped, not read ahead: usage reads it
//     as the caller does, and the reservation is settled at the end of the
//     body (io.EOF) or at its Close, whichever comes first, with the cost
//     the last document that carried usage reported (the running total
//     of a stream, the final event of an OpenAI stream sent with
//     stream_options.include_usage);
//   - a body that ends or is closed before any usage was seen (a stream
//     without include_usage, a body closed early, an error answer, a body
//     longer than 8 MiB that is not a stream) settles nothing: the call
//     stays counted at its estimate. The Logger (WithLogger) hears of a
//     2xx answer without usage at most once a minute.
//
// Only the units the estimate names are settled; the others the usage
// reports are ignored, so that one Usage serves buckets that count
// different units, and the calls of unit "" keep their estimate. Each
// Settle and Cancel is bounded by 1 s, so that a Redis that does not
// answer delays the body's Close (or last Read) by at most that; a Settle
// or Cancel that fails leaves the estimate spent and is logged at Warn to
// the Logger.
//
// Always read the body to its end or close it: a body neither read to
// its end nor closed never settles. RoundTrip refuses a limiter without
// Reserve with an error matching sluice.ErrConfig. WithReserve overrides
// WithEnter and WithCost. A nil estimate reserves one call, as Enter
// would; a nil usage reads nothing: every call keeps its estimate.
func WithReserve(estimate func(req *http.Request) bucket.Cost, usage Usage) Option {
	return func(t *Transport) { t.reserve = &reserving{estimate: estimate, usage: usage} }
}

// reserver is what WithReserve needs of a limiter.
type reserver interface {
	Reserve(ctx context.Context, c bucket.Cost) (*bucket.Reservation, error)
}

// reserving is WithReserve's configuration.
type reserving struct {
	estimate func(*http.Request) bucket.Cost
	usage    Usage
}

// sendReserved reserves r's estimate and sends r. When it does not send,
// it closes r's body, as a RoundTripper must; when the base transport
// fails, it cancels the reservation.
func (t *Transport) sendReserved(ctx context.Context, r *http.Request) (*http.Response, *bucket.Reservation, error) {
	rv, ok := t.lim.(reserver)
	if !ok {
		closeBody(r)
		return nil, nil, configerr.Invalid(errConfig, "WithReserve for a limiter (%T) with no Reserve", t.lim)
	}
	var estimate bucket.Cost // nil: Enter's cost
	if t.reserve.estimate != nil {
		estimate = t.reserve.estimate(r)
	}
	res, err := rv.Reserve(ctx, estimate)
	if err != nil {
		closeBody(r)
		return nil, nil, err
	}
	resp, err := t.base.RoundTrip(r)
	if err != nil {
		t.cancel(ctx, r, res, 0, "the request failed")
		return nil, nil, err
	}
	return resp, res, nil
}

// settleOn cancels res when s says the upstream refused the request, and
// otherwise wraps resp's body to settle res from the usage it reports.
func (t *Transport) settleOn(ctx context.Context, r *http.Request, resp *http.Response, s upstream.Signal, res *bucket.Reservation) {
	if s.Refused {
		t.cancel(ctx, r, res, s.Status, "the upstream refused the request")
		return
	}
	mt, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	resp.Body = &settlingBody{
		body: resp.Body, t: t, ctx: ctx, host: r.URL.Host, status: resp.StatusCode, res: res,
		usage: t.reserve.usage, stream: mt == "text/event-stream", seen: bucket.Cost{},
	}
}

// cancel gives res back, within settleTimeout, and logs a failure.
func (t *Transport) cancel(ctx context.Context, r *http.Request, res *bucket.Reservation, status int, why string) {
	cctx, stop := context.WithTimeout(context.WithoutCancel(ctx), settleTimeout)
	defer stop()
	if err := res.Cancel(cctx); err != nil && t.logger != nil {
		t.logger.WarnContext(ctx, "sluice: cancelling a reservation failed; its estimate stays spent",
			"host", r.URL.Host, "status", status, "why", why, "error", err)
	}
}

// settlingBody is a response body that reads the usage it carries as the
// caller reads it, and settles the reservation at its end or Close.
type settlingBody struct {
	body   io.ReadCloser
	t      *Transport
	ctx    context.Context // the request's: for the settle's values, not its end
	host   string
	status int
	res    *bucket.Reservation
	usage  Usage
	stream bool

	mu    sync.Mutex
	done  bool        // settled, or found to keep its estimate
	seen  bucket.Cost // what the usage read so far
	found bool        // a document carried usage
	// A body that is not a stream: what has been read of it, until it
	// grows past maxUsageBody (over).
	// A stream: the line being read, and the data of the event being
	// read (over: past maxEvent).
	buf   []byte
	data  []byte
	over  bool
	inEvt bool // the event has a data field
}

func (b *settlingBody) Read(p []byte) (int, error) {
	n, err := b.body.Read(p)
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done {
		return n, err
	}
	if b.stream {
		b.scan(p[:n])
	} else if !b.over {
		if len(b.buf)+n > maxUsageBody {
			b.over, b.buf = true, nil
		} else {
			b.buf = append(b.buf, p[:n]...)
		}
	}
	if err == io.EOF {
		if b.stream && len(b.buf) > 0 {
			b.line(b.buf) // a last line with no newline
		}
		if b.stream {
			b.dispatch() // a last event with no blank line after it
		}
		b.settle("the body ended")
	}
	return n, err
}

func (b *settlingBody) Close() error {
	err := b.body.Close()
	b.mu.Lock()
	defer b.mu.Unlock()
	if !b.done {
		b.settle("the body was closed")
	}
	return err
}

// settle settles the reservation at what the usage reported, or keeps its
// estimate when none was seen. It runs once; b.mu is held.
func (b *settlingBody) settle(when string) {
	b.done = true
	if !b.stream && !b.over && b.usage != nil {
		// The first JSON value: a caller's json.Decoder may close the
		// body before reading its end.
		var doc json.RawMessage
		if json.NewDecoder(bytes.NewReader(b.buf)).Decode(&doc) == nil {
			b.found = b.usage(doc, b.seen)
		}
	}
	b.buf, b.data = nil, nil
	actual := bucket.Cost{}
	est := b.res.Estimate()
	for unit, n := range b.seen {
		if _, ok := est[unit]; ok {
			actual[unit] = max(n, 0)
		}
	}
	t := b.t
	if !b.found || len(actual) == 0 {
		if t.logger != nil && b.status >= 200 && b.status < 300 && t.warned.due("\x00no usage", time.Now()) {
			t.logger.WarnContext(b.ctx, "sluice: a response carried no usage of the units reserved; the call stays counted at its estimate",
				"host", b.host, "status", b.status, "when", when, "estimate", est)
		}
		return
	}
	ctx, stop := context.WithTimeout(context.WithoutCancel(b.ctx), settleTimeout)
	defer stop()
	if err := b.res.Settle(ctx, actual); err != nil && t.logger != nil {
		t.logger.WarnContext(b.ctx, "sluice: settling a reservation failed; the call stays counted at its estimate",
			"host", b.host, "status", b.status, "estimate", est, "actual", maps.Clone(actual), "error", err)
	}
}

// scan reads the lines of a stream of server-sent events in p, the
// partial last one kept for the next Read.
func (b *settlingBody) scan(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			if len(b.buf)+len(p) > maxEvent {
				b.over, b.buf = true, b.buf[:0]
			} else {
				b.buf = append(b.buf, p...)
			}
			return
		}
		line := p[:i]
		if len(b.buf) > 0 {
			b.buf = append(b.buf, line...)
			line = b.buf
		}
		b.line(line)
		b.buf = b.buf[:0]
		p = p[i+1:]
	}
}

// line takes one line of an event stream: a data field joins the event's
// data, a blank line ends the event. Other fields and comments are not
// needed for usage.
func (b *settlingBody) line(line []byte) {
	line = bytes.TrimSuffix(line, []byte("\r"))
	if len(line) == 0 {
		b.dispatch()
		return
	}
	v, ok := bytes.CutPrefix(line, []byte("data:"))
	if !ok || b.over {
		return
	}
	v = bytes.TrimPrefix(v, []byte(" "))
	if b.inEvt {
		b.data = append(b.data, '\n')
	}
	b.inEvt = true
	if len(b.data)+len(v) > maxEvent {
		b.over = true
		return
	}
	b.data = append(b.data, v...)
}

// dispatch hands the event's data to the usage and starts the next event.
func (b *settlingBody) dispatch() {
	data, over := b.data, b.over
	b.data, b.over, b.inEvt = b.data[:0], false, false
	if over || len(data) == 0 || b.usage == nil || bytes.Equal(data, []byte("[DONE]")) {
		return
	}
	if b.usage(data, b.seen) {
		b.found = true
	}
}

// The units OpenAIUsage and AnthropicUsage report, as upstream.OpenAI and
// upstream.Anthropic name them.
const (
	unitTokens = "tokens"
	unitInput  = "input_tokens"
	unitOutput = "output_tokens"
)

// OpenAIUsage is the Usage of OpenAI's API, and of the many APIs that
// answer in its format: the usage object of a chat completion or a
// completion ({"usage": {"prompt_tokens": 9, "completion_tokens": 12,
// "total_tokens": 21}}, in the answer, or in the last event of a stream
// sent with stream_options.include_usage; the other events' "usage":
// null is no usage), of an embedding (prompt_tokens and total_tokens
// only), or of the Responses API (input_tokens and output_tokens, at the
// top or in the response of its response.completed event). It reports
// three units, the names upstream.OpenAI and upstream.Anthropic use:
// "tokens" (total_tokens, or input plus output when it is not said),
// "input_tokens" and "output_tokens". WithReserve settles those of them
// the estimate names.
func OpenAIUsage(doc []byte, seen bucket.Cost) bool {
	type usage struct {
		Prompt     *int `json:"prompt_tokens"`
		Completion *int `json:"completion_tokens"`
		Input      *int `json:"input_tokens"`
		Output     *int `json:"output_tokens"`
		Total      *int `json:"total_tokens"`
	}
	var d struct {
		Usage    *usage `json:"usage"`
		Response *struct {
			Usage *usage `json:"usage"`
		} `json:"response"`
	}
	if json.Unmarshal(doc, &d) != nil {
		return false
	}
	u := d.Usage
	if u == nil && d.Response != nil {
		u = d.Response.Usage
	}
	if u == nil {
		return false
	}
	in, out := u.Prompt, u.Completion
	if in == nil {
		in = u.Input
	}
	if out == nil {
		out = u.Output
	}
	if in == nil && out == nil && u.Total == nil {
		return false
	}
	n := func(p *int) int {
		if p == nil {
			return 0
		}
		return *p
	}
	seen[unitInput], seen[unitOutput] = n(in), n(out)
	seen[unitTokens] = n(in) + n(out)
	if u.Total != nil {
		seen[unitTokens] = *u.Total
	}
	return true
}

// AnthropicUsage is the Usage of Anthropic's Messages API: the usage
// object of a message ({"usage": {"input_tokens": 25,
// "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
// "output_tokens": 12}}), and in a stream the input usage of its
// message_start event and the running output_tokens of its message_delta
// events. It reports three units, the names upstream.Anthropic uses:
// "input_tokens" (input_tokens plus cache_creation_input_tokens, what
// Anthropic's input-tokens-per-minute limit counts; cache reads are left
// out, as that limit leaves them out), "output_tokens", and "tokens", the
// two added. message_start's output_tokens (a count of the output so far,
// 1 or so) is not taken: a stream closed before its first message_delta
// settles its input and keeps the estimate of "output_tokens" and
// "tokens". WithReserve settles the units the estimate names.
func AnthropicUsage(doc []byte, seen bucket.Cost) bool {
	type usage struct {
		Input         *int `json:"input_tokens"`
		CacheCreation *int `json:"cache_creation_input_tokens"`
		Output        *int `json:"output_tokens"`
	}
	var d struct {
		Usage   *usage `json:"usage"`
		Message *struct {
			Usage *usage `json:"usage"`
		} `json:"message"`
	}
	if json.Unmarshal(doc, &d) != nil {
		return false
	}
	u := d.Usage
	if u == nil && d.Message != nil && d.Message.Usage != nil {
		u = &usage{Input: d.Message.Usage.Input, CacheCreation: d.Message.Usage.CacheCreation} // message_start
	}
	if u == nil || (u.Input == nil && u.Output == nil) {
		return false
	}
	if u.Input != nil {
		seen[unitInput] = *u.Input
		if u.CacheCreation != nil {
			seen[unitInput] += *u.CacheCreation
		}
	}
	if u.Output != nil {
		seen[unitOutput] = *u.Output
	}
	in, inOK := seen[unitInput]
	out, outOK := seen[unitOutput]
	if inOK && outOK {
		seen[unitTokens] = in + out
	}
	return true
}
