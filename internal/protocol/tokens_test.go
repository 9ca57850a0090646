package protocol_test

import (
	"context"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/testing/guarantee"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// driver calls the pure functions of tokens.lua (the code the production
// scripts run) with fake instants. Numbers go back as strings so that no
// conversion can round them.
var driver = redis.NewScript(protocol.TokensLua + `
local f = ARGV[1]
local function n(i) return tonumber(ARGV[i]) end
if f == 'refill' then
  local l, a = refill(n(2), n(3), n(4), n(5), n(6), n(7))
  return {int(l), int(a)}
elseif f == 'slot_for' then
  return {int(slot_for(n(2), n(3), n(4), n(5), n(6), n(7)))}
elseif f == 'simulate' then
  -- ARGV: cap, amount, freq, then arrival instants (µs, ascending). Each
  -- arrival takes the next token in FIFO order, refilling at its instant
  -- and, to test that refill composes, also at random earlier instants.
  local cap, amount, freq = n(2), n(3), n(4)
  local level, anchor = nil, nil
  local out = {}
  for i = 5, #ARGV do
    local t = n(i)
    local mid = t - (t % 7)
    if level ~= nil and mid > anchor then level, anchor = refill(level, anchor, mid, cap, amount, freq) end
    level, anchor = refill(level, anchor, t, cap, amount, freq)
    out[#out + 1] = int(slot_for(level, anchor, t, 1, amount, freq))
    level = level - 1
  end
  return out
elseif f == 'lag' then
  return {int(refill_lag({cap = n(2), amount = n(3), freq = n(4), kind = 0}))}
elseif f == 'grants' then
  -- ARGV: cap, amount, freq, then (instant, cost) pairs, ascending: a new
  -- token bucket (as load makes one) whose callers come at those
  -- instants, each granted at its slot with nobody queued (enqueue.lua).
  -- Per caller: the state refilled to its instant (level, anchor), the
  -- estimate of the (cap + 3)-th token from it (a queue longer than the
  -- bucket), and its slot.
  local p = {cap = n(2), amount = n(3), freq = n(4), call = 1, kind = 0}
  local ps = {p, rolling = 0}
  local st, out = nil, {}
  for i = 5, #ARGV, 2 do
    local t, k = n(i), n(i + 1)
    if not st then st = {{level = p.cap, anchor = t + math.min(math.floor(p.freq / 2), 5000), extra = 0}, hold = 0, held = 0} end
    st[1].level, st[1].anchor = refill(st[1].level, st[1].anchor, t, p.cap, p.amount, p.freq)
    local slot = slot_k(st, ps, t, {k})
    out[#out + 1] = int(st[1].level)
    out[#out + 1] = int(st[1].anchor)
    out[#out + 1] = int(slot_all(st, ps, t, p.cap + 3))
    out[#out + 1] = int(slot)
    take_at(st, ps, slot, {k}, t)
  end
  return out
end
`)

func callDriver(t *testing.T, rdb *redis.Client, args ...any) []int64 {
	t.Helper()
	v, err := driver.Run(context.Background(), rdb, nil, args...).StringSlice()
	if err != nil {
		t.Fatal(err)
	}
	out := make([]int64, len(v))
	for i, s := range v {
		if out[i], err = strconv.ParseInt(s, 10, 64); err != nil {
			t.Fatalf("reply %q: %v", s, err)
		}
	}
	return out
}

// An epoch-µs instant of today's size: 16 digits, the size that %.14g
// formatting would have corrupted.
const epoch = int64(1_763_769_600_123_457)

func TestRefillTable(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	for _, tc := range []struct {
		name                  string
		level, anchor, now    string // "" = missing state
		cap, amount, freq     int64
		wantLevel, wantAnchor int64
	}{
		{"new bucket is full, anchored now", "", "", "0", 10, 2, 1000, 10, 0},
		{"no time passed", "3", "0", "0", 10, 2, 1000, 3, 0},
		{"just before a refill", "3", "0", "999", 10, 2, 1000, 3, 0},
		{"exactly at a refill", "3", "0", "1000", 10, 2, 1000, 5, 1000},
		{"several refills, anchor on the grid", "3", "0", "3500", 10, 2, 1000, 9, 3000},
		{"capped at capacity", "3", "0", "100000", 10, 2, 1000, 10, 100000},
		{"debt is paid back first", "-7", "0", "2000", 10, 2, 1000, -3, 2000},
		{"capacity 1, 1 µs refill", "0", "5", "6", 1, 1, 1, 1, 6},
		{"clock behind the anchor: unchanged", "2", "5000", "4000", 10, 2, 1000, 2, 5000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now, _ := strconv.ParseInt(tc.now, 10, 64)
			args := []any{"refill", tc.level, shift(tc.anchor), epoch + now, tc.cap, tc.amount, tc.freq}
			got := callDriver(t, rdb, args...)
			if got[0] != tc.wantLevel || got[1]-epoch != tc.wantAnchor {
				t.Errorf("Lua refill = (%d, epoch%+d), want (%d, epoch%+d)", got[0], got[1]-epoch, tc.wantLevel, tc.wantAnchor)
			}
			if tc.level == "" {
				return // a missing state: the Go side (queue/push.go) starts full itself
			}
			level, _ := strconv.ParseInt(tc.level, 10, 64)
			anchor, _ := strconv.ParseInt(tc.anchor, 10, 64)
			gl, ga := protocol.Refill(level, epoch+anchor, epoch+now, protocol.Policy{Capacity: tc.cap, RefillAmount: tc.amount, RefillFrequency: time.Duration(tc.freq) * time.Microsecond})
			if gl != tc.wantLevel || ga-epoch != tc.wantAnchor {
				t.Errorf("Go Refill = (%d, epoch%+d), want (%d, epoch%+d)", gl, ga-epoch, tc.wantLevel, tc.wantAnchor)
			}
		})
	}
}

func shift(anchor string) string {
	if anchor == "" {
		return ""
	}
	a, _ := strconv.ParseInt(anchor, 10, 64)
	return strconv.FormatInt(epoch+a, 10)
}

func TestSlotForTable(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	for _, tc := range []struct {
		name               string
		level, anchor, now int64
		k, amount, freq    int64
		want               int64 // relative to epoch
	}{
		{"token in the bucket: now", 1, 0, 500, 1, 1, 1000, 500},
		{"k-th token still in the bucket", 3, 0, 500, 3, 1, 1000, 500},
		{"empty: next refill", 0, 0, 500, 1, 1, 1000, 1000},
		{"second in line waits two refills", 0, 0, 500, 2, 1, 1000, 2000},
		{"amount 3 serves three per refill", 0, 0, 500, 3, 3, 1000, 1000},
		{"fourth of amount 3 waits two", 0, 0, 500, 4, 3, 1000, 2000},
		{"in debt", -5, 0, 10, 1, 2, 1000, 3000},
		{"20 ms refill, capacity 1", 0, 0, 1, 1, 1, 20_000, 20_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := callDriver(t, rdb, "slot_for", tc.level, epoch+tc.anchor, epoch+tc.now, tc.k, tc.amount, tc.freq)
			if got[0]-epoch != tc.want {
				t.Errorf("Lua slot_for = epoch%+d, want epoch%+d", got[0]-epoch, tc.want)
			}
			p := protocol.Policy{Capacity: 1 << 30, RefillAmount: tc.amount, RefillFrequency: time.Duration(tc.freq) * time.Microsecond}
			if g := protocol.SlotFor(tc.level, epoch+tc.anchor, epoch+tc.now, tc.k, p); g-epoch != tc.want {
				t.Errorf("Go SlotFor = epoch%+d, want epoch%+d", g-epoch, tc.want)
			}
		})
	}
}

// TestSlotsInvariant feeds random arrivals (bursts, idle gaps, refill
// periods down to 1 ms, capacity 1) through the production refill and
// slot functions and checks every schedule: the guarantee over all slots,
// FIFO (slots never decrease in arrival order), no slot before its arrival,
// and no wait for the first caller of a new bucket.
func TestSlotsInvariant(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	rng := rand.New(rand.NewPCG(7, 11))
	for trial := 0; trial < 300; trial++ {
		capacity := int64(1 + rng.IntN(6))
		amount := 1 + rng.Int64N(capacity)
		freq := int64(1000 * (1 + rng.IntN(20))) // 1–20 ms
		now := epoch
		var arrivals []any
		for i := 0; i < 80; i++ {
			switch rng.IntN(4) {
			case 0: // burst: same instant
			case 1:
				now += rng.Int64N(freq)
			case 2:
				now += rng.Int64N(5 * freq)
			default:
				now += rng.Int64N(50 * freq) // idle
			}
			arrivals = append(arrivals, now)
		}
		slots := callDriver(t, rdb, append([]any{"simulate", capacity, amount, freq}, arrivals...)...)
		times := make([]time.Time, len(slots))
		for i, s := range slots {
			times[i] = time.UnixMicro(s)
			if a := arrivals[i].(int64); s < a {
				t.Fatalf("trial %d: slot %d before its arrival %d", trial, s, a)
			}
		}
		if !slices.IsSorted(slots) {
			t.Fatalf("trial %d: slots not in arrival order: %v", trial, slots)
		}
		l := guarantee.Limit{Capacity: int(capacity), RefillAmount: int(amount), RefillFrequency: time.Duration(freq) * time.Microsecond}
		if res := guarantee.Check(times, l); !res.OK() {
			t.Fatalf("trial %d %+v: %v", trial, l, res)
		}
		// The first arrival at a new bucket never waits.
		if slots[0] != arrivals[0].(int64) {
			t.Fatalf("trial %d: first caller of a new bucket waited %d µs", trial, slots[0]-arrivals[0].(int64))
		}
	}
}

// TestRefillLagTable: refill_lag and protocol.RefillLag agree, min(fill / 2,
// 5 ms), fill being ⌈cap / amount⌉ periods.
func TestRefillLagTable(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	for _, tc := range []struct {
		cap, amount, freq, want int64
	}{
		{60_000, 1, 100, 5000}, // the tokens: fill 6 s
		{1000, 1, 100, 5000},   // fill 100 ms
		{10, 1, 100, 500},      // fill 1 ms
		{1, 1, 20_000, 5000},   // one a period of 20 ms
		{1, 1, 1000, 500},      // one a period of 1 ms: half of it
		{10, 10, 1_000_000, 5000},
		{3, 2, 3, 3},          // ⌈3/2⌉ periods of 3 µs: 6 µs, half is 3
		{7, 2, 2500, 5000},    // 4 periods of 2.5 ms: 10 ms, exactly twice the bound
		{7, 2, 2499, 4998},    // just under
		{1 << 60, 1, 1, 5000}, // no overflow
		{5, 5, 1, 0},          // 1 µs: half of it rounds down to nothing
	} {
		got := callDriver(t, rdb, "lag", tc.cap, tc.amount, tc.freq)
		p := protocol.Policy{Capacity: tc.cap, RefillAmount: tc.amount, RefillFrequency: time.Duration(tc.freq) * time.Microsecond}
		if g := protocol.RefillLag(p); got[0] != tc.want || g != tc.want {
			t.Errorf("cap %d amount %d freq %d µs: Lua refill_lag %d, Go RefillLag %d, want %d", tc.cap, tc.amount, tc.freq, got[0], g, tc.want)
		}
	}
}

// takeAt is take_at for one token bucket policy, as Go reads its result:
// the state the scripts save, which Inspect and Estimate read with Refill
// and SlotFor.
func takeAt(level, anchor, slot, now, k int64, p protocol.Policy) (int64, int64) {
	before, at := level, anchor
	if slot > now && slot > anchor {
		l, a := protocol.Refill(level, anchor, slot, p)
		gained := (a - anchor) / p.RefillFrequency.Microseconds() * p.RefillAmount
		level -= level + gained - l
		before, at = l, a
	}
	return level - k, anchor + protocol.LagShift(p, before, slot, at)
}

// grants runs the "grants" driver: per caller, the state at its instant,
// the estimate of the (cap + 3)-th token, and its slot.
func grants(t *testing.T, rdb *redis.Client, p protocol.Policy, reqs [][2]int64) [][4]int64 {
	t.Helper()
	args := []any{"grants", p.Capacity, p.RefillAmount, p.RefillFrequency.Microseconds()}
	for _, r := range reqs {
		args = append(args, r[0], r[1])
	}
	v := callDriver(t, rdb, args...)
	out := make([][4]int64, len(reqs))
	for i := range out {
		copy(out[i][:], v[4*i:])
	}
	return out
}

// TestFullBucketRefillLag: a grant that takes a full token bucket below its
// capacity starts its refills refill_lag after its slot, on a new bucket
// and on one full again after idling, so that the second slot comes the
// lag plus the refills it needs after the first (the reproduction:
// 1,000 tokens refilling 1 every 100 µs, 1,000 then 100).
func TestFullBucketRefillLag(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	p := protocol.Policy{Capacity: 1000, RefillAmount: 1, RefillFrequency: 100 * time.Microsecond}
	lag := protocol.RefillLag(p)
	if lag != 5000 {
		t.Fatalf("lag %d µs, want 5 ms", lag)
	}
	// Off the refill grid: a grant at a refill instant counts as one the
	// refill filled the bucket for, which moves nothing (lag_shift).
	idle := int64(300_037)
	got := grants(t, rdb, p, [][2]int64{{epoch, 1000}, {epoch + 200, 100}, {epoch + idle, 1000}, {epoch + idle + 200, 100}})
	for i, what := range []string{"a new bucket", "a bucket full again after idling"} {
		first, second := got[2*i][3], got[2*i+1][3]
		if d := second - first; d != lag+100*100 {
			t.Errorf("%s: second slot %d µs after the first, want the lag %d + 10 ms", what, d, lag)
		}
	}
}

// TestRefillLagTwins: over random callers (bursts, idle spells, costs up
// to the capacity, periods from 1 µs to 20 ms), the Go twins read the
// state take_at leaves as the scripts do (SlotFor's slot and estimate),
// and an upstream keeping the same books, whose full bucket starts its
// refills only when a request arrives, refuses nothing when each request
// arrives within the lag of its slot (in the order of the slots).
func TestRefillLagTwins(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	rng := rand.New(rand.NewPCG(31, 5))
	for trial := 0; trial < 200; trial++ {
		capacity := 1 + rng.Int64N([]int64{1, 5, 50, 2000}[rng.IntN(4)])
		amount := 1 + rng.Int64N(capacity)
		freq := 1 + rng.Int64N([]int64{10, 200, 2000, 20_000}[rng.IntN(4)])
		p := protocol.Policy{Capacity: capacity, RefillAmount: amount, RefillFrequency: time.Duration(freq) * time.Microsecond}
		lag := protocol.RefillLag(p)
		fill := (capacity + amount - 1) / amount * freq
		now := epoch
		var reqs [][2]int64
		for i := 0; i < 60; i++ {
			switch rng.IntN(4) {
			case 0: // burst
			case 1:
				now += rng.Int64N(freq + 1)
			case 2:
				now += rng.Int64N(fill + 1)
			default:
				now += rng.Int64N(3*fill + 2*lag + 1) // idle, often back to full
			}
			reqs = append(reqs, [2]int64{now, 1 + rng.Int64N(capacity)})
		}
		got := grants(t, rdb, p, reqs)
		level, anchor := capacity, reqs[0][0]+min(freq/2, 5000)
		var slots []int64
		var sat []bool // sat[i]: request i's grant found the bucket sitting full
		for i, r := range reqs {
			level, anchor = protocol.Refill(level, anchor, r[0], p)
			slot := protocol.SlotFor(level, anchor, r[0], r[1], p)
			est := protocol.SlotFor(level, anchor, r[0], capacity+3, p)
			if want := [4]int64{level, anchor, est, slot}; got[i] != want {
				t.Fatalf("trial %d %+v, caller %d (%v): Lua level, anchor, estimate, slot %v; Go %v", trial, p, i, r, got[i], want)
			}
			// Does this grant find the bucket sitting full (new, or
			// full again after idling)? Only then may its request
			// arrive up to the lag late: at saturation the grants come
			// at the refills that fill it, and their requests on time.
			lv, an := level, anchor
			if slot > r[0] && slot > anchor {
				lv, an = protocol.Refill(level, anchor, slot, p)
			}
			sat = append(sat, protocol.LagShift(p, lv, slot, an) > 0)
			level, anchor = takeAt(level, anchor, slot, r[0], r[1], p)
			slots = append(slots, slot)
		}
		if !slices.IsSorted(slots) {
			t.Fatalf("trial %d %+v: slots out of order: %v", trial, p, slots)
		}
		// The upstream: the same policy, whose refills start from a
		// request that finds it full (it lost them until then).
		ul, ua, last := capacity, int64(0), int64(0)
		for i, r := range reqs {
			var late int64
			if sat[i] {
				late = rng.Int64N(lag + 1)
			}
			at := max(last, slots[i]+late)
			last = at
			if ul < capacity {
				n := (at - ua) / freq
				ul, ua = min(capacity, ul+n*amount), ua+n*freq
			}
			if ul >= capacity {
				ua = at
			}
			if ul < r[1] {
				t.Fatalf("trial %d %+v lag %d: request %d (cost %d, slot %d, arrived %d µs after it) found the upstream at %d",
					trial, p, lag, i, r[1], slots[i]-epoch, at-slots[i], ul)
			}
			ul -= r[1]
		}
	}
}
