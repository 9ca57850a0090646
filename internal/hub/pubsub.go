package hub

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Pub/Sub: every handle of a Hub listens on one connection. A handle
// listens on a channel only while it has callers waiting for a message
// there (Listen, and the stop function it returns); the channels wanted
// are subscribed and unsubscribed by one goroutine that runs while what
// is wanted differs from what is subscribed, so a burst of callers coming
// and going costs a few SUBSCRIBE and UNSUBSCRIBE commands, not one each.
// When no channel has been wanted for linger, the connection is closed:
// an idle Hub holds none. A message published before Redis confirms a
// subscription is lost; every user of Listen treats messages as hints
// that only save time.

// linger is how long the Pub/Sub connection stays open with no channel
// wanted, so that callers coming in bursts do not redial it each time.
const linger = 2 * time.Second

// subscribeTimeout bounds one SUBSCRIBE or UNSUBSCRIBE.
const subscribeTimeout = 5 * time.Second

// listener is one Listen call's functions.
type listener struct {
	fn    func(payload string)
	ready func()
}

type subscriptions struct {
	h *Hub

	mu     sync.Mutex
	wanted map[string][]*listener // channel → its listeners
	have   map[string]bool        // subscribed (or being subscribed) on ps
	// dirty holds the channels whose wanted or have changed since the
	// reconciler last compared them: it compares only those, so that one
	// handle's callers coming and going cost O(1), not a walk over the
	// channels of every handle (thousands of buckets on one client).
	dirty     map[string]struct{}
	ps        *redis.PubSub // nil while no connection is open
	psDone    chan struct{} // closed when ps's reader returns
	running   bool          // the reconciler runs
	kick      chan struct{} // wakes the reconciler from its linger
	failures  int64         // SUBSCRIBE/UNSUBSCRIBE calls that failed
	delivered int64         // messages handed to a listener
}

func (s *subscriptions) init(h *Hub) {
	s.h = h
	s.wanted = make(map[string][]*listener)
	s.have = make(map[string]bool)
	s.dirty = make(map[string]struct{})
	s.kick = make(chan struct{}, 1)
	// The reader waits on the connection, not on the group's ctx: closing
	// the connection ends it.
	h.group.OnClose(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.ps != nil {
			_ = s.ps.Close()
		}
	})
}

// Listen calls fn with the payload of every message published on channel
// until stop is called. Listening starts at once and takes effect when
// Redis confirms the subscription, shortly after: then ready, unless nil,
// is called, and again each time the subscription is confirmed anew (after
// a reconnection), since messages published meanwhile are lost. fn and
// ready run on the Hub's reader goroutine and must not block.
func (h *Hub) Listen(channel string, fn func(payload string), ready func()) (stop func()) {
	s := &h.subs
	l := &listener{fn: fn, ready: ready}
	s.mu.Lock()
	first := len(s.wanted[channel]) == 0
	s.wanted[channel] = append(s.wanted[channel], l)
	if first {
		s.dirty[channel] = struct{}{}
		s.wake()
	}
	s.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			ls := s.wanted[channel]
			for i, x := range ls {
				if x == l {
					ls = append(ls[:i:i], ls[i+1:]...)
					break
				}
			}
			if len(ls) == 0 {
				delete(s.wanted, channel)
				s.dirty[channel] = struct{}{}
				s.wake()
			} else {
				s.wanted[channel] = ls
			}
		})
	}
}

// wake starts the reconciler, or wakes it from its linger. Called with mu
// held.
func (s *subscriptions) wake() {
	if s.running {
		select {
		case s.kick <- struct{}{}:
		default:
		}
		return
	}
	if s.h.group.Go(s.reconcile) {
		s.running = true
	}
}

// reconcile subscribes what is wanted and unsubscribes what is not, until
// both agree; then, with nothing wanted, it lingers and closes the
// connection. It ends when both agree with something wanted (the reader
// goes on), after closing the connection, or when the Hub closes.
func (s *subscriptions) reconcile(ctx context.Context) {
	backoff := 10 * time.Millisecond
	for {
		s.mu.Lock()
		sub, unsub := s.diffLocked()
		if ctx.Err() != nil {
			s.closeLocked()
			s.running = false
			s.mu.Unlock()
			return
		}
		if len(sub) == 0 && len(unsub) == 0 {
			if len(s.wanted) > 0 || s.ps == nil {
				s.running = false
				s.mu.Unlock()
				return
			}
			// Nothing wanted: linger, then close the connection.
			s.mu.Unlock()
			if s.lingerAndClose(ctx) {
				return
			}
			continue
		}
		s.openLocked()
		s.markLocked(sub, unsub)
		ps := s.ps
		s.mu.Unlock()
		if err := subscribe(ctx, ps, sub, unsub); err != nil {
			// Forget what may not have been done, and try again after a
			// pause: until then callers wait on their estimates.
			s.mu.Lock()
			s.failures++
			s.markLocked(unsub, sub)
			s.dirtyLocked(sub, unsub)
			s.mu.Unlock()
			pause(ctx, backoff)
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 10 * time.Millisecond
	}
}

// diffLocked returns the channels wanted but not subscribed (sub), and
// those subscribed but no longer wanted (unsub), of the dirty ones, and
// forgets which were dirty. Called with mu held.
func (s *subscriptions) diffLocked() (sub, unsub []string) {
	for c := range s.dirty {
		switch wanted := len(s.wanted[c]) > 0; {
		case wanted && !s.have[c]:
			sub = append(sub, c)
		case !wanted && s.have[c]:
			unsub = append(unsub, c)
		}
	}
	clear(s.dirty)
	return sub, unsub
}

// dirtyLocked marks the channels of each list dirty. Called with mu held.
func (s *subscriptions) dirtyLocked(lists ...[]string) {
	for _, l := range lists {
		for _, c := range l {
			s.dirty[c] = struct{}{}
		}
	}
}

// lingerAndClose waits linger with nothing wanted, then closes the
// connection unless a channel is wanted or subscribed by then. It reports
// that the reconciler is done: it closed the connection and nothing came
// meanwhile. A kick or the Hub closing cut the linger short.
func (s *subscriptions) lingerAndClose(ctx context.Context) (done bool) {
	t := time.NewTimer(linger)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-s.kick:
	case <-t.C:
		s.mu.Lock()
		defer s.mu.Unlock()
		if len(s.wanted) == 0 && len(s.have) == 0 {
			s.closeLocked()
			if len(s.wanted) == 0 { // none came while it closed
				s.running = false
				return true
			}
		}
	}
	return false
}

// openLocked opens the connection and starts its reader, unless it is
// open. go-redis dials at the first SUBSCRIBE. Called with mu held.
func (s *subscriptions) openLocked() {
	if s.ps != nil {
		return
	}
	s.ps = s.h.rdb.Subscribe(context.Background())
	done := make(chan struct{})
	s.psDone = done
	ch := s.ps.ChannelWithSubscriptions(redis.WithChannelSize(1000))
	if !s.h.group.Go(func(context.Context) { s.read(ch, done) }) {
		close(done)
	}
}

// markLocked marks the channels added as subscribed (or being subscribed)
// and those removed as not. Called with mu held.
func (s *subscriptions) markLocked(added, removed []string) {
	for _, c := range added {
		s.have[c] = true
	}
	for _, c := range removed {
		delete(s.have, c)
	}
}

// subscribe subscribes sub and then unsubscribes unsub on ps, the two
// calls bounded together by subscribeTimeout.
func subscribe(ctx context.Context, ps *redis.PubSub, sub, unsub []string) error {
	cctx, cancel := context.WithTimeout(ctx, subscribeTimeout)
	defer cancel()
	if len(sub) > 0 {
		if err := ps.Subscribe(cctx, sub...); err != nil {
			return err
		}
	}
	if len(unsub) > 0 {
		return ps.Unsubscribe(cctx, unsub...)
	}
	return nil
}

// pause waits d, or until ctx ends.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// closeLocked closes the connection, if open, and waits for its reader.
// Called with mu held.
func (s *subscriptions) closeLocked() {
	if s.ps == nil {
		return
	}
	_ = s.ps.Close()
	done := s.psDone
	s.ps, s.psDone = nil, nil
	clear(s.have)
	for c := range s.wanted { // to be subscribed again on the next connection
		s.dirty[c] = struct{}{}
	}
	s.mu.Unlock()
	<-done
	s.mu.Lock()
}

// read hands each message to the listeners of its channel, and each
// confirmed subscription to their ready, until the connection closes.
func (s *subscriptions) read(ch <-chan any, done chan struct{}) {
	defer close(done)
	for m := range ch {
		switch m := m.(type) {
		case *redis.Message:
			s.mu.Lock()
			ls := s.wanted[m.Channel]
			if len(ls) > 0 {
				s.delivered++
			}
			s.mu.Unlock()
			for _, l := range ls {
				l.fn(m.Payload)
			}
		case *redis.Subscription:
			if m.Kind != "subscribe" {
				continue
			}
			s.mu.Lock()
			ls := s.wanted[m.Channel]
			s.mu.Unlock()
			for _, l := range ls {
				if l.ready != nil {
					l.ready()
				}
			}
		}
	}
}

// PubSubStats are counters of a Hub's Pub/Sub, for tests.
type PubSubStats struct {
	Channels  int  // subscribed now
	Open      bool // a connection is open
	Failures  int64
	Delivered int64
}

// PubSubStats returns the counters.
func (h *Hub) PubSubStats() PubSubStats {
	s := &h.subs
	s.mu.Lock()
	defer s.mu.Unlock()
	return PubSubStats{Channels: len(s.have), Open: s.ps != nil, Failures: s.failures, Delivered: s.delivered}
}
