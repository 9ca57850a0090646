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
