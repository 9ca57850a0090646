package queue

import (
	"fmt"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/queueio"
)

// TestFastMatchesEnqueue: fast.lua, with enqueue.lua after it when the
// case is not its own (the fast lane, fast.go), leaves the state (string
// and TTL), the config key's TTL and the queue exactly as enqueue.lua
// alone does, and replies the same, from random states of one policy, on
// a clock that stands still (miniredis): full buckets and drained ones,
// anchors past and ahead (the refill lag), peaks of 0 to 9 entries,
// holds, callers with costs queued, older formats, waits of their own.
func TestFastMatchesEnqueue(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	rng := rand.New(rand.NewPCG(5, 6))
	served := 0
	const rounds = 3000
	for round := range rounds {
		now := int64(1_700_000_000_000_000) + rng.Int64N(1e12)
		mr.SetTime(time.UnixMicro(now))
		p := randomPolicy(rng)
		opt := queueio.Options{Lookahead: 20 * time.Millisecond, LockTTL: time.Second, Grace: time.Duration(1+rng.IntN(10)) * time.Second, MaxLateness: time.Second}
		if rng.IntN(4) == 0 {
			opt.MaxWait = time.Duration(rng.IntN(30)) * time.Millisecond
		}
		var qs [2]*Queue
		state, queued := randomState(rng, p, now, opt.Grace)
		for i := range qs {
			qs[i] = newQ(rdb, "sluice", fmt.Sprintf("%s-%d-%d", t.Name(), round, i), []protocol.Policy{p}, opt)
			seed(t, rdb, qs[i], p, state, queued)
		}
		var waits []time.Duration
		if rng.IntN(3) == 0 {
			waits = []time.Duration{time.Duration(rng.IntN(30_000)) * time.Microsecond}
		}
		want, werr := enqueueAlone(t, qs[0], waits)
		got, ok, gerr := qs[1].enqueueFast(ctx, qs[1].conf.Load(), waits)
		if ok {
			served++
		} else {
			got, gerr = enqueueAlone(t, qs[1], waits)
		}
		if fmt.Sprint(got, errText(gerr)) != fmt.Sprint(want, errText(werr)) {
			t.Fatalf("round %d, state %q, queued %d, fast %v: reply %v (%v), want %v (%v)", round, state, queued, ok, got, gerr, want, werr)
		}
		for _, key := range []func(k queueio.Keys) string{
			func(k queueio.Keys) string { return k.State },
			func(k queueio.Keys) string { return k.Config },
			func(k queueio.Keys) string { return k.Queue },
		} {
			w, g := dump(rdb, key(qs[0].keys)), dump(rdb, key(qs[1].keys))
			if g != w {
				t.Fatalf("round %d, state %q, queued %d, fast %v: reply %v: %s\n got %s\nwant %s", round, state, queued, ok, got, key(qs[1].keys), g, w)
			}
		}
	}
	if served < rounds/5 {
		t.Fatalf("fast.lua served %d of %d rounds: the test misses its case", served, rounds)
	}
	t.Logf("fast.lua served %d of %d rounds", served, rounds)
}

// TestFastMatchesEnqueueInSequence: callers one after another, a few
// hundred µs apart, on buckets far from their limit and near it: the
// states (their peaks a staircase that merges past 8 entries) stay the
// same call after call through enqueue.lua alone and through the fast
// lane (Enqueue, which tries fast.lua while its callers are granted at
// once).
func TestFastMatchesEnqueueInSequence(t *testing.T) {
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	defer rdb.Close()
	rng := rand.New(rand.NewPCG(7, 8))
	for n, p := range []protocol.Policy{
		{Capacity: 1 << 40, RefillAmount: 1 << 30, RefillFrequency: time.Millisecond},
		{Capacity: 1e9, RefillAmount: 1e9, RefillFrequency: time.Second},
		{Capacity: 50, RefillAmount: 1, RefillFrequency: 2 * time.Millisecond},
		{Capacity: 10, RefillAmount: 10, RefillFrequency: 10 * time.Millisecond},
	} {
		opt := queueio.Options{Lookahead: 20 * time.Millisecond, LockTTL: time.Second, Grace: 50 * time.Millisecond, MaxLateness: time.Second}
		viaFull := newQ(rdb, "sluice", fmt.Sprintf("%s-%d-full", t.Name(), n), []protocol.Policy{p}, opt)
		viaFast := newQ(rdb, "sluice", fmt.Sprintf("%s-%d-fast", t.Name(), n), []protocol.Policy{p}, opt)
		for _, q := range []*Queue{viaFull, viaFast} {
			seed(t, rdb, q, p, "", 0)
		}
		// Not the push lane: its guess that callers still wait is wrong
		// here, where the queue is emptied after every call.
		viaFast.lane.off.Store(true)
		now := int64(1_700_000_000_000_000)
		served := 0
		for i := range 1000 {
			now += rng.Int64N(3000)
			mr.SetTime(time.UnixMicro(now))
			ids := []string{fmt.Sprint("c", i)}
			want, werr := enqueueAlone(t, viaFull, nil)
			fast := viaFast.granting.Load()
			got, gerr := viaFast.Enqueue(ctx, ids, nil, nil)
			if fast && viaFast.granting.Load() {
				served++
			}
			wants, werr := parseEnqueue(ids, []string{""}, want, werr)
			if fmt.Sprint(got, gerr) != fmt.Sprint(wants, werr) {
				t.Fatalf("policy %d, call %d: reply %v (%v), want %v (%v)", n, i, got, gerr, wants, werr)
			}
			if g, w := dump(rdb, viaFast.keys.State), dump(rdb, viaFull.keys.State); g != w {
				t.Fatalf("policy %d, call %d: state\n got %s\nwant %s", n, i, g, w)
			}
			// The queue empties as its callers' slots come (no scheduler here).
			for _, q := range []*Queue{viaFull, viaFast} {
				rdb.Del(ctx, q.keys.Queue)
			}
		}
		t.Logf("policy %d: %d of 1000 callers through the fast lane", n, served)
	}
}

// enqueueAlone runs enqueue.lua for one caller "c" of q, without the fast
// lane.
func enqueueAlone(t *testing.T, q *Queue, waits []time.Duration) (any, error) {
	t.Helper()
	c := q.conf.Load()
	args, err := q.enqueueArgs(c, []string{"c"}, nil, []string{""}, waits)
	if err != nil {
		t.Fatal(err)
	}
	return q.runFor(ctx, enqueueScript, enqueueKeys(q.keys), true, func(*conf) ([]any, error) { return args, nil })
}

func randomPolicy(rng *rand.Rand) protocol.Policy {
	if rng.IntN(3) == 0 {
		return protocol.Policy{Capacity: 1 << 40, RefillAmount: 1 << 30, RefillFrequency: time.Millisecond}
	}
	p := protocol.Policy{Capacity: 1 + rng.Int64N(20), RefillAmount: 1 + rng.Int64N(3), RefillFrequency: time.Duration(1+rng.Int64N(50_000)) * time.Microsecond}
	switch rng.IntN(8) {
	case 0:
		p.Kind = protocol.Fixed
	case 1:
		p.Unit = "pu"
	}
	return p
}

// randomState is a state string of policy p at now (µs), mostly one
// fast.lua may serve, and how many callers to queue.
func randomState(rng *rand.Rand, p protocol.Policy, now int64, grace time.Duration) (string, int) {
	freq := p.RefillFrequency.Microseconds()
	level := p.Capacity - rng.Int64N(3)
	if rng.IntN(3) == 0 {
		level = rng.Int64N(p.Capacity+4) - 3
	}
	anchor := now - rng.Int64N(3*freq+1)
	if rng.IntN(3) == 0 {
		anchor = now + rng.Int64N(5001) // a lag ahead
	}
	hold, costed, id, format := "0 0", "0 0", protocol.ConfigID([]protocol.Policy{p}), protocol.StateFormat
	switch rng.IntN(12) {
	case 0:
		hold = fmt.Sprintf("%d 0", now+rng.Int64N(20_000)-10_000)
	case 1:
		costed = "1 3"
	case 2:
		id = "other"
	case 3:
		return fmt.Sprintf("%d 0 %d %d 1", rng.Int64N(100), level, anchor), 0 // format 1
	case 4:
		return "", 0 // none
	}
	pk := randomPeaks(rng, p, now, grace)
	queued := 0
	if rng.IntN(6) == 0 {
		queued = 1 + rng.IntN(2)
	}
	till := []int64{0, now - 1000, now + 1000}[rng.IntN(3)]
	return fmt.Sprintf("%d %d %d %d %d %s %s %s %s", rng.Int64N(200), till, level, anchor, format, id, hold, costed, pk), queued
}

// randomPeaks is a peaks token: 0 to 9 entries, in time order, some
// before grace, some ahead of now, levels up and down.
func randomPeaks(rng *rand.Rand, p protocol.Policy, now int64, grace time.Duration) string {
	switch rng.IntN(20) {
	case 0:
		return ""
	case 1:
		return fmt.Sprintf("p%d/%d:1,2", now-5, now-3)
	}
	t := now - grace.Microseconds() - rng.Int64N(2*grace.Microseconds())
	b := fmt.Appendf(nil, "p%d", t-rng.Int64N(1000))
	for range rng.IntN(10) {
		t += rng.Int64N(grace.Microseconds()/2 + 1)
		if rng.IntN(20) == 0 {
			t = max(t, now) + rng.Int64N(30_000) // a slot ahead
		}
		b = fmt.Appendf(b, "/%d:%d", t, p.Capacity-rng.Int64N(p.Capacity+3))
	}
	return string(b)
}

// seed gives q's bucket state (none when ""), p's configuration, and
// queued callers.
func seed(t *testing.T, rdb *redis.Client, q *Queue, p protocol.Policy, state string, queued int) {
	t.Helper()
	if state != "" {
		if err := rdb.Set(ctx, q.keys.State, state, time.Hour).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if err := rdb.Set(ctx, q.keys.Config, protocol.FormatConfig(protocol.Config{Policies: []protocol.Policy{p}}), time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	for i := range queued {
		if err := rdb.RPush(ctx, q.keys.Queue, fmt.Sprintf("w%d|1", i)).Err(); err != nil {
			t.Fatal(err)
		}
	}
}

// dump is a key's value and TTL, without the bucket's name.
func dump(rdb *redis.Client, key string) string {
	ttl := rdb.PTTL(ctx, key).Val()
	var v string
	switch rdb.Type(ctx, key).Val() {
	case "list":
		v = strings.Join(rdb.LRange(ctx, key, 0, -1).Val(), ",")
	default:
		v = rdb.Get(ctx, key).Val()
	}
	return fmt.Sprintf("%q ttl %v", v, ttl)
}

var luaLine = regexp.MustCompile(`:[0-9]+:`)

// errText is err's message without the Lua stack and line numbers.
func errText(err error) string {
	if err == nil {
		return ""
	}
	s, _, _ := strings.Cut(err.Error(), " stack traceback")
	return luaLine.ReplaceAllString(s, ":")
}
