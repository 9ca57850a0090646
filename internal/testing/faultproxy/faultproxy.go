// Package faultproxy is a TCP proxy on a loopback port that injects network
// faults between a client and one server, for tests: latency on every
// connection, and a cut that closes every link and refuses new ones until
// it is restored.
//
// A link's latency is one-way and applies in both directions, so a round
// trip through the proxy costs twice the link's delay. Data keeps its order
// and pipelining: the delay is added to each chunk's arrival, it does not
// throttle throughput.
package faultproxy

import (
	"errors"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

// Proxy forwards connections from its own loopback address to a target.
// Its methods are safe for concurrent use.
type Proxy struct {
	ln     net.Listener
	target string
	wg     sync.WaitGroup

	mu       sync.Mutex
	lo, hi   time.Duration // each new link draws its one-way delay in [lo, hi]
	cut      bool
	closed   bool
	links    map[*link]struct{}
	accepted int
	refused  int
}

// New listens on a free loopback port and forwards every connection to
// target. The caller must call Close.
func New(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{ln: ln, target: target, links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the proxy's host:port; clients connect here instead of target.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// SetDelay makes every link, current and future, delay each chunk of data
// by a one-way delay drawn once per link, uniformly in [lo, hi]: a round
// trip then costs between 2·lo and 2·hi more. SetDelay(0, 0) removes it.
func (p *Proxy) SetDelay(lo, hi time.Duration) {
	if hi < lo {
		hi = lo
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lo, p.hi = lo, hi
	for l := range p.links {
		l.setDelay(p.drawLocked())
	}
}

func (p *Proxy) drawLocked() time.Duration {
	if p.hi <= p.lo {
		return p.lo
	}
	return p.lo + rand.N(p.hi-p.lo+1)
}

// Cut closes every link at once and refuses new connections (accepted and
// closed at once) until Restore, as when the network between the client
// and the server fails.
func (p *Proxy) Cut() {
	p.mu.Lock()
	p.cut = true
	links := p.links
	p.links = map[*link]struct{}{}
	p.mu.Unlock()
	for l := range links {
		l.close()
	}
}

// Restore ends a Cut: new connections are forwarded again.
func (p *Proxy) Restore() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// Stats are counters since New.
type Stats struct {
	Accepted int // connections forwarded
	Refused  int // connections refused during a cut
	Live     int // links open now
}

// Stats returns the counters.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return Stats{Accepted: p.accepted, Refused: p.refused, Live: len(p.links)}
}

// Close stops listening, closes every link and waits for every goroutine.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	links := p.links
	p.links = map[*link]struct{}{}
	p.mu.Unlock()
	err := p.ln.Close()
	for l := range links {
		l.close()
	}
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		p.mu.Lock()
		if p.cut || p.closed {
			p.refused++
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.mu.Unlock()
		s, err := net.DialTimeout("tcp", p.target, time.Second)
		if err != nil {
			c.Close()
			continue
		}
		l := &link{client: c, server: s}
		p.mu.Lock()
		if p.cut || p.closed { // cut while dialling
			p.refused++
			p.mu.Unlock()
			l.close()
			continue
		}
		l.delay = p.drawLocked()
		p.links[l] = struct{}{}
		p.accepted++
		p.mu.Unlock()
		p.wg.Add(2)
		go p.pipe(l, c, s)
		go p.pipe(l, s, c)
	}
}

func (p *Proxy) forget(l *link) {
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
	l.close()
}

// link is one client connection and its connection to the target.
type link struct {
	client, server net.Conn
	once           sync.Once

	mu    sync.Mutex
	delay time.Duration
}

func (l *link) setDelay(d time.Duration) {
	l.mu.Lock()
	l.delay = d
	l.mu.Unlock()
}

func (l *link) getDelay() time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.delay
}

func (l *link) close() {
	l.once.Do(func() {
		l.client.Close()
		l.server.Close()
	})
}

// chunk is data read from one side, due on the other side at due.
type chunk struct {
	data []byte
	due  time.Time
}

// pipe copies from src to dst, each chunk delayed by the link's delay. A
// reader stamps chunks as they arrive; a writer sends each at its due time,
// so chunks in flight overlap (latency, not bandwidth).
func (p *Proxy) pipe(l *link, src, dst net.Conn) {
	defer p.wg.Done()
	defer p.forget(l)
	ch := make(chan chunk, 256)
	done := make(chan struct{})
	go func() { // the writer; it ends when ch closes or a write fails
		defer close(done)
		t := time.NewTimer(0)
		<-t.C
		for c := range ch {
			if d := time.Until(c.due); d > 0 {
				t.Reset(d)
				<-t.C
			}
			if _, err := dst.Write(c.data); err != nil {
				l.close()
				for range ch { // drain so the reader never blocks
				}
				return
			}
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			ch <- chunk{data: append([]byte(nil), buf[:n]...), due: time.Now().Add(l.getDelay())}
		}
		if err != nil {
			break
		}
	}
	close(ch)
	<-done
	// Half-close is not needed for Redis: end the whole link.
}
