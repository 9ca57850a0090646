package semaphore

import (
	_ "embed"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"
)

// sync.lua's owner: the batch one exchange carries, the script's ARGV,
// and its reply.

// The script is lanes.lua's functions, then sync.lua's body.
var (
	//go:embed sync.lua
	syncSource string
	//go:embed lanes.lua
	lanesSource string

	syncScript = redis.NewScript(lanesSource + syncSource)
)

// batch is everything one exchange with Redis carries.
type batch struct {
	releases  []releaseOp
	leaves    []leaveOp
	renews    []*Permit
	registers []*Permit // held while Redis was away: written into Redis (fallback.go)
	refresh   []*waiter
	acquires  []*waiter
	set       *setOp // SetCapacity, sent alone
	wantWait  bool   // ask when the first lease ends, for the poke timer
	returning bool   // the first exchange since Redis answered again (registering)
}

// setOp is a SetCapacity call.
type setOp struct {
	n    int
	done chan error
}

func (b *batch) empty() bool {
	return len(b.releases)+len(b.leaves)+len(b.renews)+len(b.registers)+len(b.refresh)+len(b.acquires) == 0 && b.set == nil
}

// syncArgs is sync.lua's ARGV for b (see its header): the counts and
// modes first, then the ids of each list in the order of the counts.
func (s *Semaphore) syncArgs(b batch) []interface{} {
	s.mu.Lock()
	wantWait := 0
	if b.wantWait && len(s.waiters) > 0 {
		wantWait = 1
	}
	capacity, mode := s.capacity, "follow"
	switch {
	case b.set != nil:
		capacity, mode = b.set.n, "set"
	case !s.accepted:
		mode = "claim"
	}
	s.mu.Unlock()
	args := make([]interface{}, 0, 16+len(b.releases)+len(b.leaves)+len(b.renews)+len(b.registers)+2*len(b.refresh)+len(b.acquires))
	args = append(args, capacity)
	args = append(args, s.fixedArgs[:5]...)
	args = append(args, wantWait,
		len(b.releases), len(b.leaves), len(b.renews), len(b.refresh), len(b.acquires), mode)
	args = append(args, s.fixedArgs[5:]...)
	args = append(args, len(b.registers))
	for _, r := range b.releases {
		args = append(args, r.id)
	}
	for _, l := range b.leaves {
		args = append(args, l.id)
	}
	for _, p := range b.renews {
		args = append(args, p.id)
	}
	for _, p := range b.registers {
		args = append(args, p.id)
	}
	s.mu.Lock()
	for _, w := range b.refresh {
		args = append(args, w.id, strconv.FormatInt(w.ticket, 10))
	}
	s.mu.Unlock()
	for _, w := range b.acquires {
		args = append(args, w.id)
	}
	return args
}

// reply is sync.lua's answer; see its header.
type reply struct {
	released, left, renewed, refreshed []int64
	acquired                           []int64
	granted                            []grant
	wait                               int64
	capacity                           int64 // in force

	// A refusal instead: "format" with the stored format, or "mismatch"
	// with the stored capacity.
	refusal, refused string
}

type grant struct {
	id string
	us int64
}

var errReply = errors.New("unexpected reply from sync.lua")

func parseReply(v interface{}, b *batch) (reply, error) {
	var r reply
	top, ok := v.([]interface{})
	if !ok || len(top) < 2 {
		return r, fmt.Errorf("%w: %T %v", errReply, v, v)
	}
	if kind, ok := top[0].(string); ok {
		var ok2 bool
		switch x := top[1].(type) {
		case string:
			r.refused, ok2 = x, true
		case int64:
			r.refused, ok2 = strconv.FormatInt(x, 10), true
		}
		if len(top) != 2 || !ok2 || (kind != "format" && kind != "mismatch") {
			return r, fmt.Errorf("%w: refusal %v", errReply, top)
		}
		r.refusal = kind
		return r, nil
	}
	// {capacity, wait, released..., left..., renewed..., refreshed...,
	// acquired..., granted...}: every list but granted has the length the
	// batch asked for.
	fixed := 2 + len(b.releases) + len(b.leaves) + len(b.renews) + len(b.refresh) + len(b.acquires)
	if len(top) < fixed || (len(top)-fixed)%2 != 0 {
		return r, fmt.Errorf("%w: %d values for a batch that wants %d and grant pairs", errReply, len(top), fixed)
	}
	ints := make([]int64, fixed)
	for i := range ints {
		if ints[i], ok = top[i].(int64); !ok {
			return r, fmt.Errorf("%w: %T where an integer belongs", errReply, top[i])
		}
	}
	r.capacity, r.wait = ints[0], ints[1]
	if r.capacity < 1 {
		return r, fmt.Errorf("%w: capacity %d", errReply, r.capacity)
	}
	rest := ints[2:]
	next := func(n int) []int64 {
		out := rest[:n:n]
		rest = rest[n:]
		return out
	}
	r.released = next(len(b.releases))
	r.left = next(len(b.leaves))
	r.renewed = next(len(b.renews))
	r.refreshed = next(len(b.refresh))
	r.acquired = next(len(b.acquires))
	for i := fixed; i < len(top); i += 2 {
		id, ok1 := top[i].(string)
		us, ok2 := top[i+1].(int64)
		if !ok1 || !ok2 {
			return r, fmt.Errorf("%w: grant %v %v", errReply, top[i], top[i+1])
		}
		r.granted = append(r.granted, grant{id: id, us: us})
	}
	return r, nil
}
