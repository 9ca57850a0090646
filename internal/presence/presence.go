// Package presence counts the processes that use one limiter: each of
// their handles (a Bucket or Semaphore made by New; a process normally
// makes one per limiter) leaves a trace in Redis (a member of a sorted set scored by the Redis
// time) at most once per Every while it has callers, and reads back how
// many left one within Window. A process that falls back to a local share
// while Redis is away (Config.Fallback of a bucket or a semaphore) divides
// the limit by the last count it read.
package presence

import (
	"context"
	_ "embed"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/redis/go-redis/v9"
)

// Every is how often a process with callers traces itself; Window how
// long a trace counts. A process that stopped using the limiter leaves
// the count within Window; one that started counts from its first trace.
const (
	Every  = time.Second
	Window = 5 * time.Second
)

//go:embed presence.lua
var lua string

var script = redis.NewScript(lua)

// Trace is one limiter's presence: safe for concurrent use.
type Trace struct {
	rdb    redis.Scripter
	key    string
	member string // a UUID per Trace: each handle counts as one user

	mu    sync.Mutex
	next  time.Time // local clock: the next trace is due then
	count atomic.Int64
	// top is the highest count read within Window, and when (under
	// mu): Count never says fewer processes than that.
	top   int64
	topAt time.Time
	now   func() time.Time // time.Now; tests move it
}

// New returns the trace of the limiter whose set is key, sent through rdb.
func New(rdb redis.Scripter, key string) *Trace {
	return &Trace{rdb: rdb, key: key, member: uuid.NewString(), now: time.Now}
}

// Due reports whether a trace is due (Every has passed since the last
// one began), and claims it: the caller that gets true sends it (Send).
func (t *Trace) Due(now time.Time) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if now.Before(t.next) {
		return false
	}
	t.next = now.Add(Every)
	return true
}

// Send leaves this process's trace and reads the count.
func (t *Trace) Send(ctx context.Context) error {
	v, err := script.Run(ctx, t.rdb, []string{t.key, t.key + ":born"}, t.member, Window.Milliseconds()).Int64Slice()
	if err == nil && len(v) != 2 {
		err = fmt.Errorf("presence: reply %v", v)
	}
	if err != nil {
		// Try again at the next call rather than in a second.
		t.mu.Lock()
		t.next = time.Time{}
		t.mu.Unlock()
		return err
	}
	n, young := v[0], v[1] == 1
	t.mu.Lock()
	defer t.mu.Unlock()
	switch now := t.now(); {
	case n >= t.top:
		t.top, t.topAt = n, now
	case young:
		// A set younger than the window (Redis restarted empty) may not
		// hold every process yet, however long ago the higher count.
	case now.Sub(t.topAt) > Window:
		t.top, t.topAt = n, now
	}
	t.count.Store(t.top)
	return nil
}

// Count is the processes traced within Window, this one included: the
// most any successful Send read within the last Window (0 before the
// first), or since, while the set is younger than Window (Redis restarted
// empty, or lost the traces: the processes trace themselves again only
// one by one). A count that falls sooner does not count: a process that
// then fell back to its local share would take the share of one of fewer
// processes than there are.
func (t *Trace) Count() int { return int(t.count.Load()) }
