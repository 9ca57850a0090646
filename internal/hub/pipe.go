package hub

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Pipelining: the script calls and small pipelines of every handle on a Hub
// share round trips when many are made at once. At most maxInflight sends
// are in flight at a time, each on a connection of its own: a call made
// while fewer are, and none waits, goes out at once on its caller's
// goroutine and ctx, so an uncontended call costs one round trip, as on
// the bare client, and a slow Redis does not hold one caller up behind
// another's. Calls made while maxInflight sends are in flight wait, and
// go out together in one pipeline, in their order of arrival, as soon as
// a send ends. Two thousand buckets whose callers arrive at once then cost
// Redis a few round trips, and the connection pool a few connections,
// instead of one each, which exhausted the pool.
//
// A caller whose ctx ends while its call waits returns ctx.Err() at once;
// its call is then dropped if it has not left yet, or its reply ignored.

// maxInflight bounds the sends in flight: below go-redis's default pool
// (10 per CPU), so that what does not go through the pipelining (the
// Pub/Sub connection, the application's own commands) finds connections.
const maxInflight = 8

// maxPipeline is the most calls in one pipeline.
const maxPipeline = 512

// pipelineTimeout bounds one shared pipeline (each caller still returns at
// its own deadline).
const pipelineTimeout = 5 * time.Second

type pipe struct {
	h *Hub

	// rtt is how long sends take now (ns): it follows a slower one at
	// once and a faster one by an eighth of the difference.
	rtt atomic.Int64

	mu       sync.Mutex
	inflight int // sends in flight: inline calls, transactions, pipelines
	pending  []*unit
	freed    chan struct{} // closed (and replaced) when inflight drops; nil when nobody waits
}

// unit is one caller's call: the commands fn queues.
type unit struct {
	ctx  context.Context
	fn   func(redis.Pipeliner) error
	done chan struct{} // closed when cmds and err are set
	cmds []redis.Cmder
	err  error
}

// do runs fn's commands, alone or in a shared pipeline. sent reports that
// fn ran and its commands' replies are in (false: the caller's ctx ended
// first, and the commands fn made must not be read).
func (p *pipe) do(ctx context.Context, fn func(redis.Pipeliner) error) (cmds []redis.Cmder, err error, sent bool) {
	p.mu.Lock()
	if p.inflight < maxInflight && len(p.pending) == 0 {
		p.inflight++
		p.mu.Unlock()
		start := time.Now()
		stamp(ctx, start)
		cmds, err = p.h.rdb.Pipelined(ctx, fn)
		p.observe(time.Since(start))
		p.done()
		return cmds, err, true
	}
	u := &unit{ctx: ctx, fn: fn, done: make(chan struct{})}
	p.pending = append(p.pending, u)
	p.startLocked()
	p.mu.Unlock()
	select {
	case <-u.done:
		return u.cmds, u.err, true
	case <-ctx.Done():
		return nil, ctx.Err(), false
	}
}

// sentAtKey is the ctx key of SentAt.
type sentAtKey struct{}

// SentAt returns ctx such that a call made under it through h's
// pipelining records in *at when it (its last round trip) left for Redis:
// a call may wait for a shared pipeline, and a caller that judges how late
// it is from when it asked would count that wait. *at is set before the
// call returns its reply. A call that returns early on ctx may still have
// *at set later, by the shared pipeline it was handed to: read *at only
// after a reply.
func SentAt(ctx context.Context, at *time.Time) context.Context {
	return context.WithValue(ctx, sentAtKey{}, at)
}

func stamp(ctx context.Context, t time.Time) {
	if at, ok := ctx.Value(sentAtKey{}).(*time.Time); ok {
		*at = t
	}
}

// observe notes how long a send took.
func (p *pipe) observe(d time.Duration) {
	for {
		cur := p.rtt.Load()
		next := int64(d)
		if int64(d) < cur {
			next = cur - (cur-int64(d))/8
		}
		if p.rtt.CompareAndSwap(cur, next) {
			return
		}
	}
}

// RoundTrip is how long the calls made through h's pipelining take now: a
// busy process's callers poll earlier by it.
func (h *Hub) RoundTrip() time.Duration { return time.Duration(h.pipe.rtt.Load()) }

// done ends a send.
func (p *pipe) done() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inflight--
	if p.freed != nil {
		close(p.freed)
		p.freed = nil
	}
	p.startLocked()
}

// tx runs a transaction on the client (it cannot share a pipeline), once
// fewer than maxInflight sends are in flight: a burst of transactions
// then holds a few connections, not one each.
func (p *pipe) tx(ctx context.Context, c *redis.Client, fn func(redis.Pipeliner) error) ([]redis.Cmder, error) {
	for {
		p.mu.Lock()
		if p.inflight < maxInflight && len(p.pending) == 0 {
			p.inflight++
			p.mu.Unlock()
			break
		}
		if p.freed == nil {
			p.freed = make(chan struct{})
		}
		freed := p.freed
		p.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	defer p.done()
	stamp(ctx, time.Now())
	return c.TxPipelined(ctx, fn)
}

// startLocked sends what waits, in pipelines of at most maxPipeline, while
// fewer than maxInflight sends are in flight. Called with mu held.
func (p *pipe) startLocked() {
	for len(p.pending) > 0 && p.inflight < maxInflight {
		n := min(len(p.pending), maxPipeline)
		batch := make([]*unit, n)
		copy(batch, p.pending)
		p.pending = append(p.pending[:0:0], p.pending[n:]...)
		p.inflight++
		send := func(ctx context.Context) {
			// What was handed in is sent even as the Hub closes.
			p.send(context.WithoutCancel(ctx), batch)
			p.done()
		}
		if !p.h.group.Go(send) {
			go send(context.Background()) // the Hub is closing
		}
	}
}

// send runs batch in one pipeline and hands each unit its replies.
func (p *pipe) send(ctx context.Context, batch []*unit) {
	pl := p.h.rdb.Pipeline()
	ends := make([]int, len(batch))
	for i, u := range batch {
		if u.ctx.Err() != nil {
			u.err = u.ctx.Err() // its caller left: do not send it
		} else if err := u.fn(pl); err != nil {
			// Commands fn queued before failing go out (a pipeline
			// cannot take them back); its caller hears its error.
			u.err = err
		}
		ends[i] = pl.Len()
	}
	ctx, cancel := context.WithTimeout(ctx, pipelineTimeout)
	start := time.Now()
	for _, u := range batch {
		if u.err == nil {
			stamp(u.ctx, start) // read by its caller after done closes
		}
	}
	cmds, err := pl.Exec(ctx)
	p.observe(time.Since(start))
	cancel()
	from := 0
	for i, u := range batch {
		to := ends[i]
		if u.err == nil {
			if to <= len(cmds) {
				u.cmds = cmds[from:to]
			}
			for _, c := range u.cmds {
				if cerr := c.Err(); cerr != nil {
					u.err = cerr
					break
				}
			}
			if u.cmds == nil && err != nil {
				u.err = err
			}
		}
		from = to
		close(u.done)
	}
}

// Client is a Hub's client with its pipelining: script calls (EvalSha,
// Eval) and Pipelined made through it by every handle share round trips.
// Everything else goes to the client as it is. It is safe for concurrent
// use.
type Client struct {
	redis.UniversalClient
	p *pipe
}

// Client returns h's client with the shared pipelining.
func (h *Hub) Pipelining() *Client { return &Client{UniversalClient: h.rdb, p: &h.pipe} }

// Direct is the client's one server, when it is one (*redis.Client), for
// commands that must reach the server whose clock wrote a key; nil on
// Cluster or Ring.
func (c *Client) Direct() *redis.Client {
	d, _ := c.UniversalClient.(*redis.Client)
	return d
}

// TxPipelined runs fn's commands in a transaction on the one server
// (Direct), or on the client; a burst of them holds a few connections.
func (c *Client) TxPipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error) {
	if d := c.Direct(); d != nil {
		return c.p.tx(ctx, d, fn)
	}
	return c.UniversalClient.TxPipelined(ctx, fn)
}

// Pipelined runs fn's commands in a pipeline shared with other callers':
// the error is the first of fn's own commands' errors, as on the client.
func (c *Client) Pipelined(ctx context.Context, fn func(redis.Pipeliner) error) ([]redis.Cmder, error) {
	cmds, err, _ := c.p.do(ctx, fn)
	return cmds, err
}

// EvalSha is the client's, in a shared pipeline.
func (c *Client) EvalSha(ctx context.Context, sha1 string, keys []string, args ...any) *redis.Cmd {
	return c.eval(ctx, func(p redis.Pipeliner) *redis.Cmd { return p.EvalSha(ctx, sha1, keys, args...) })
}

// Eval is the client's, in a shared pipeline.
func (c *Client) Eval(ctx context.Context, script string, keys []string, args ...any) *redis.Cmd {
	return c.eval(ctx, func(p redis.Pipeliner) *redis.Cmd { return p.Eval(ctx, script, keys, args...) })
}

// call runs one command, queued by queue, through the pipelining. The
// closure it hands do sets a variable of its own, which a shared pipeline
// runs on its own goroutine: call reads it only once do reported the call
// sent (the pipeline's end happened before), and otherwise returns a
// command of its own (made by failed) carrying the error, never touching
// the variable.
func call[C redis.Cmder](ctx context.Context, c *Client, queue func(redis.Pipeliner) C, failed func(context.Context) C) C {
	var cmd C
	var queued bool
	_, err, sent := c.p.do(ctx, func(p redis.Pipeliner) error {
		cmd, queued = queue(p), true
		return nil
	})
	if sent && queued {
		return cmd
	}
	f := failed(ctx)
	f.SetErr(err)
	return f
}

func (c *Client) eval(ctx context.Context, queue func(redis.Pipeliner) *redis.Cmd) *redis.Cmd {
	return call(ctx, c, queue, func(ctx context.Context) *redis.Cmd { return redis.NewCmd(ctx) })
}

// Get is the client's, in a shared pipeline (a bucket reads its
// configuration so on its first call: two thousand at once, otherwise).
func (c *Client) Get(ctx context.Context, key string) *redis.StringCmd {
	return call(ctx, c, func(p redis.Pipeliner) *redis.StringCmd { return p.Get(ctx, key) }, func(ctx context.Context) *redis.StringCmd { return redis.NewStringCmd(ctx) })
}

// SetNX is the client's, in a shared pipeline (a bucket stores its
// configuration so on its first call).
func (c *Client) SetNX(ctx context.Context, key string, value any, expiration time.Duration) *redis.BoolCmd {
	return call(ctx, c, func(p redis.Pipeliner) *redis.BoolCmd { return p.SetNX(ctx, key, value, expiration) }, func(ctx context.Context) *redis.BoolCmd { return redis.NewBoolCmd(ctx) })
}
