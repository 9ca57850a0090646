package protocol_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/protocol"
	"github.com/sluicehq/sluice/internal/scriptreply"
	"github.com/sluicehq/sluice/internal/testing/redistest"
)

// wire drives the Lua side of each format: it reads what Go built and
// builds it again, so each test is a round trip Go → Lua → Go.
var wire = protocol.Script(`
local f = ARGV[1]
if f == 'state' then
  -- ARGV[2] state string, ARGV[3] now, ARGV[4] the configuration's id,
  -- ARGV[5..] each policy's capacity (its level: full, so the key's TTL
  -- is the grace); load it at a now less than a period after every
  -- anchor (nothing refills) and save it. KEYS[2] is the config key.
  local ps = {rolling = 0}
  for i = 5, #ARGV do ps[#ps + 1] = {cap = tonumber(ARGV[i]), amount = 1, freq = 1e12, kind = 0} end
  redis.call('SET', KEYS[1], ARGV[2])
  local now = tonumber(ARGV[3])
  local st, done, till, _, raw = load(KEYS[1], ps, now, KEYS[2], ARGV[4])
  save(KEYS[1], st, ps, now, 1000000, done, till, KEYS[2])
  local saved = redis.call('GET', KEYS[1])
  -- save_extras writes the same string when nothing changed
  if raw then
    save_extras(KEYS[1], raw, st)
    if redis.call('GET', KEYS[1]) ~= saved then
      return redis.error_reply('save_extras wrote ' .. redis.call('GET', KEYS[1]) .. ' where save wrote ' .. saved)
    end
  end
  return saved
elseif f == 'entry' then
  -- ARGV[2] an entry: its parts, and the entry built again from them
  local id, est, costs = entry_parts(ARGV[2])
  if not est then return {id, '', '', ''} end
  local cs = costs and table.concat(costs, ',') or ''
  return {id, int(est), entry(id, est, cs), cs}
elseif f == 'wake' then
  -- ARGV[2..] entry, slot pairs: publish them as one message
  local list = {}
  for i = 2, #ARGV, 2 do wake_add(list, ARGV[i], tonumber(ARGV[i + 1])) end
  wake_publish(KEYS[1], list)
  return 1
elseif f == 'window' then
  -- ARGV[2] level, ARGV[3] now, ARGV[4] k, ARGV[5] cap, ARGV[6] window
  -- µs, ARGV[7..] the log's entries: window_refill then window_slot of
  -- a rolling policy, and the entries left in its window
  LOG_BASE = KEYS[1] .. ':window:'
  redis.call('DEL', log_key(1))
  for i = 7, #ARGV do redis.call('RPUSH', log_key(1), ARGV[i]) end
  local p = {cap = tonumber(ARGV[5]), amount = tonumber(ARGV[5]), freq = tonumber(ARGV[6]), call = 1, kind = ROLLING}
  local s = {level = tonumber(ARGV[2]), anchor = 0}
  local now = tonumber(ARGV[3])
  window_refill(s, p, 1, now)
  local slot = window_slot(s, p, 1, now, tonumber(ARGV[4]))
  return {int(s.level), int(slot), #s.log}
elseif f == 'notice' then
  config_notice(KEYS[1], ARGV[2])
  return 1
end
`, protocol.TokensLua, protocol.StateLua, protocol.EntryLua, protocol.WakeLua)

const µs = int64(1_763_769_600_123_457) // 16 digits: %.14g would round it

func TestStateRoundTrip(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	ctx := context.Background()
	const id = "c0123456789abcdef"
	keys := []string{t.Name(), t.Name() + ":config"}
	if err := rdb.Set(ctx, keys[1], "2 "+id+" {}", 0).Err(); err != nil {
		t.Fatal(err)
	}
	run := func(s string, levels ...int64) (string, error) {
		args := []any{"state", s, µs + 6_696_000, id}
		for _, l := range levels {
			args = append(args, l)
		}
		return wire.Run(ctx, rdb, keys, args...).Text()
	}
	for _, s := range []protocol.BucketState{
		{Done: 0, Until: 0, Levels: []protocol.Level{{Level: 5, Anchor: µs}}},
		{Done: 1 << 40, Until: µs + 1000, Levels: []protocol.Level{{Level: -1234567, Anchor: µs}}},
		{Done: 7, Until: 0, Levels: []protocol.Level{{Level: 1000, Anchor: µs}, {Level: -3, Anchor: µs + 6_696_000}, {Level: 0, Anchor: µs - 1}}},
		// Callers with costs queued: how many, and each policy's extra.
		{Done: 7, Until: 0, Levels: []protocol.Level{{Level: 1000, Anchor: µs}, {Level: -3, Anchor: µs + 6_696_000}}, Costed: 2, Extra: []int64{-2, 119}},
		{Done: 3, Until: µs, Levels: []protocol.Level{{Level: 4, Anchor: µs}}, Costed: 1, Extra: []int64{59}},
		// A hold in force, over the second policy only.
		{Done: 3, Levels: []protocol.Level{{Level: 4, Anchor: µs}, {Level: 9, Anchor: µs}}, Hold: µs + 60_000_000, Held: 2, Costed: 1, Extra: []int64{0, 5}},
		// Peaks (state.lua's "Peaks"): kept as they are by a script that
		// grants nothing, younger than the grace (1 s here).
		{Done: 9, Levels: []protocol.Level{{Level: 4, Anchor: µs}}, Peaks: fmt.Sprintf("p%d/%d:3", µs, µs+6_000_000)},
		{Done: 9, Levels: []protocol.Level{{Level: 4, Anchor: µs}, {Level: -2, Anchor: µs}}, Costed: 1, Extra: []int64{0, 5},
			Peaks: fmt.Sprintf("p%d/%d:3,0/%d:1,2", µs, µs+6_000_000, µs+6_500_000)},
	} {
		s.Format, s.ID = protocol.StateFormat, id
		if s.Peaks == "" {
			// A state without peaks gets them when saved: from the last
			// slot its levels promise (no grant before it was counted).
			until := µs + 6_696_000
			for _, l := range s.Levels {
				if l.Level < 0 {
					until = max(until, l.Anchor-l.Level*1e12)
				}
			}
			s.Peaks = fmt.Sprintf("p%d", until)
			if s.Levels[0].Level == -1234567 {
				s.Peaks = "p1236330769600123392" // the float arithmetic of Lua (the floor only needs to be late enough)
			}
		}
		raw := s.String()
		var levels []int64
		for _, l := range s.Levels {
			levels = append(levels, l.Level)
		}
		back, err := run(raw, levels...)
		if err != nil {
			t.Fatal(err)
		}
		if back != raw {
			t.Errorf("Lua read %q and wrote %q", raw, back)
		}
		got, err := protocol.ParseState(back, len(s.Levels))
		if err != nil || got.String() != raw {
			t.Errorf("ParseState(%q) = %+v, %v", back, got, err)
		}
		// The same state in the older formats is read as what it is and
		// written back in this one, under the configuration in force.
		for _, f := range []int64{1, 0} {
			if (f == 0 && s.Costed > 0) || s.Hold > 0 || strings.Contains(s.Peaks, "/") {
				continue // format 0 had no costs, and neither had holds or peaks
			}
			old := s
			old.Format, old.ID, old.Peaks = f, "", ""
			back, err := run(old.String(), levels...)
			if err != nil || back != raw {
				t.Errorf("format %d state %q came back %q, %v; want %q", f, old.String(), back, err, raw)
			}
			if got, err := protocol.ParseState(old.String(), len(s.Levels)); err != nil || got.Format != f || got.Costed != s.Costed || got.ID != "" {
				t.Errorf("ParseState(%q) = %+v, %v", old.String(), got, err)
			}
		}
	}
	// Saving renews the config key's TTL: Lua's CONFIG_TTL_MS is ConfigTTL.
	if ttl, err := rdb.PTTL(ctx, keys[1]).Result(); err != nil || ttl > protocol.ConfigTTL || ttl < protocol.ConfigTTL-time.Minute {
		t.Errorf("config key TTL %v, %v after a save; want ConfigTTL %v", ttl, err, protocol.ConfigTTL)
	}
	// A state of another configuration is refused before anything is
	// written: the config key names the one in force.
	other := protocol.BucketState{Done: 4, Levels: []protocol.Level{{Level: 5, Anchor: µs}}, Format: protocol.StateFormat, ID: "cffffffffffffffff"}
	if _, err := run(other.String(), 5); err == nil || !strings.Contains(err.Error(), "was written under configuration cffffffffffffffff") {
		t.Errorf("Lua read a state of another configuration: %v", err)
	}
	if _, err := wire.Run(ctx, rdb, []string{t.Name(), t.Name() + ":other"}, "state", "", µs, id, 5).Text(); err == nil || !raised(err, "SLUICE_CONFIG unset") {
		t.Errorf("Lua loaded a state with no configuration stored: %v", err)
	}
	// A later format is refused, by Lua and by Go, saying so.
	later := "4 0 5 1763769600123457 3 cx"
	if _, err := run(later, 5); err == nil || !strings.Contains(err.Error(), "format 3") {
		t.Errorf("Lua read a state of format 3: %v", err)
	}
	if _, err := protocol.ParseState(later, 1); err == nil || !strings.Contains(err.Error(), "upgrade") {
		t.Errorf("ParseState read a state of format 3: %v", err)
	}
	for _, bad := range []string{"", "1 2 3", "1 2 x 4", "1 2 3 4.5", "1 2 3 4 2"} {
		if _, err := protocol.ParseState(bad, 1); err == nil {
			t.Errorf("ParseState(%q) accepted it", bad)
		}
	}
}

// TestConfigRoundTrip: the config key's value reads back as written, its
// id names its policies, and a later format or a forged id is refused.
func TestConfigRoundTrip(t *testing.T) {
	c := protocol.Config{Policies: []protocol.Policy{
		{Capacity: 10, RefillAmount: 1, RefillFrequency: 100 * time.Millisecond},
		{Unit: "pu", Capacity: 1000, RefillAmount: 3, RefillFrequency: time.Second},
	}, Replaced: []string{"c1", "c2"}}
	raw := protocol.FormatConfig(c)
	got, err := protocol.ParseConfig(raw)
	if err != nil || got.ID() != c.ID() || !slices.Equal(got.Replaced, c.Replaced) || !slices.Equal(got.Policies, c.Policies) {
		t.Fatalf("ParseConfig(%q) = %+v, %v", raw, got, err)
	}
	if !got.Follows(c.ID()) || !got.Follows("c2") || got.Follows("c3") {
		t.Errorf("Follows wrong for %+v", got)
	}
	other := c
	other.Policies = slices.Clone(c.Policies)
	other.Policies[1].Unit = "tokens"
	if other.ID() == c.ID() || !strings.HasPrefix(c.ID(), "c") || len(c.ID()) != 17 {
		t.Errorf("ids %s and %s", c.ID(), other.ID())
	}
	for _, bad := range []string{"", "2", "2 c1 {}", "3 " + c.ID() + " {}", "2 " + other.ID() + raw[len("2 "+c.ID()):], "x " + raw} {
		if _, err := protocol.ParseConfig(bad); err == nil {
			t.Errorf("ParseConfig(%q) accepted it", bad)
		}
	}
}

func TestEntryRoundTrip(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	for _, c := range []struct {
		id    string
		est   int64
		costs string
	}{{"a", 0, ""}, {"AbC-_9.z1", µs, ""}, {"with|bar", 12, ""}, {"", 3, ""}, {"AbC-_9.z1", µs, "1,60,60"}, {"a", 0, "0,0"}} {
		e := protocol.MakeEntry(c.id, c.est, c.costs)
		v, err := wire.Run(context.Background(), rdb, []string{"k"}, "entry", e).StringSlice()
		if err != nil {
			t.Fatal(err)
		}
		if v[0] != c.id || v[2] != e || v[3] != c.costs {
			t.Errorf("Lua parts of %q = %q, rebuilt %q", e, v, v[2])
		}
		if got := protocol.EntryCosts(e); got != c.costs {
			t.Errorf("EntryCosts(%q) = %q, want %q", e, got, c.costs)
		}
		if id := protocol.EntryID(e); id != c.id && c.id != "with|bar" {
			t.Errorf("EntryID(%q) = %q", e, id)
		}
		if est, ok := protocol.EntryEstimate(e); !ok || est != c.est {
			t.Errorf("EntryEstimate(%q) = %d, %v", e, est, ok)
		}
	}
	// A bare ID (a caller that gave up before it learned its entry).
	v, err := wire.Run(context.Background(), rdb, []string{"k"}, "entry", "bare").StringSlice()
	if err != nil || v[0] != "bare" || v[1] != "" {
		t.Errorf("Lua parts of a bare ID: %q, %v", v, err)
	}
	if _, ok := protocol.EntryEstimate("bare"); ok || protocol.EntryID("bare") != "bare" {
		t.Error("Go misread a bare ID")
	}
}

func TestWakeRoundTrip(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	ctx := context.Background()
	sub := rdb.Subscribe(ctx, t.Name())
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil {
		t.Fatal(err)
	}
	sent := []protocol.Wake{{Entry: "a|0", Slot: µs}, {Entry: "b|" + "123", Slot: µs + 1}}
	args := []any{"wake"}
	for _, w := range sent {
		args = append(args, w.Entry, w.Slot)
	}
	if err := wire.Run(ctx, rdb, []string{t.Name()}, args...).Err(); err != nil {
		t.Fatal(err)
	}
	msg, err := sub.ReceiveMessage(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if msg.Payload != protocol.FormatWake(sent) {
		t.Errorf("Lua sent %q, Go formats %q", msg.Payload, protocol.FormatWake(sent))
	}
	var got []protocol.Wake
	protocol.ParseWake(msg.Payload, func(e string, s int64) { got = append(got, protocol.Wake{Entry: e, Slot: s}) })
	if len(got) != len(sent) || got[0] != sent[0] || got[1] != sent[1] {
		t.Errorf("ParseWake(%q) = %v, want %v", msg.Payload, got, sent)
	}
	if _, ok := protocol.ConfigNotice(msg.Payload); ok {
		t.Errorf("wake message %q read as a config notice", msg.Payload)
	}
	// A live change's notice names the configuration and no caller.
	if err := wire.Run(ctx, rdb, []string{t.Name()}, "notice", "c0123456789abcdef").Err(); err != nil {
		t.Fatal(err)
	}
	if msg, err = sub.ReceiveMessage(ctx); err != nil {
		t.Fatal(err)
	}
	if id, ok := protocol.ConfigNotice(msg.Payload); !ok || id != "c0123456789abcdef" {
		t.Errorf("ConfigNotice(%q) = %q, %v", msg.Payload, id, ok)
	}
	protocol.ParseWake(msg.Payload, func(e string, s int64) {
		if strings.Contains(e, "|") {
			t.Errorf("a config notice names caller %q", e)
		}
	})
	var _ redis.Scripter = rdb
}

// TestWindowTwins: protocol.WindowRefill and WindowSlot, which Inspect
// uses, give what tokens.lua's window_refill and window_slot give the
// scripts, over random logs.
func TestWindowTwins(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(11, 12))
	for trial := 0; trial < 300; trial++ {
		capacity := int64(1 + rng.IntN(50))
		w := time.Duration(1+rng.IntN(2000)) * time.Millisecond
		p := protocol.Policy{Capacity: capacity, RefillAmount: capacity, RefillFrequency: w, Kind: protocol.Rolling}
		now := µs
		var log []protocol.WindowEntry
		var used int64
		at := now - protocol.WindowSpan(p) - int64(rng.IntN(50_000))
		for n := rng.IntN(40); n > 0 && used < capacity; n-- {
			c := 1 + int64(rng.IntN(int(capacity)))
			at += int64(rng.IntN(100_000))
			log = append(log, protocol.WindowEntry{Slot: at, Cost: c})
			used += c
		}
		level := capacity - used
		k := int64(rng.IntN(int(2 * capacity)))
		args := []any{"window", level, now, k, capacity, w.Microseconds()}
		for _, e := range log {
			args = append(args, fmt.Sprintf("%d %d", e.Slot, e.Cost))
		}
		v, err := wire.Run(ctx, rdb, []string{t.Name()}, args...).Int64Slice()
		if err != nil {
			t.Fatal(err)
		}
		gl, left := protocol.WindowRefill(level, log, now, p)
		gs := protocol.WindowSlot(gl, left, now, k, p)
		if v[0] != gl || v[1] != gs || v[2] != int64(len(left)) {
			t.Fatalf("trial %d (%+v, level %d, k %d, log %v): Lua level %d slot %d, %d left; Go level %d slot %d, %d left",
				trial, p, level, k, log, v[0], v[1], v[2], gl, gs, len(left))
		}
	}
}

// TestConstantTwins: the constants the scripts spell out are their Go
// twins': claim.lua's CLAIM_REACH is ClaimReach.
func TestConstantTwins(t *testing.T) {
	rdb := redistest.New(t).Client()
	defer rdb.Close()
	ctx := context.Background()
	s := protocol.Script(`return {CLAIM_REACH}`, protocol.TokensLua, protocol.StateLua, protocol.EntryLua, protocol.ClaimLua)
	v, err := s.Run(ctx, rdb, nil).Int64Slice()
	if err != nil {
		t.Fatal(err)
	}
	if want := []int64{protocol.ClaimReach.Microseconds()}; !slices.Equal(v, want) {
		t.Fatalf("the scripts' CLAIM_REACH is %v µs, want %v (ClaimReach)", v, want)
	}
}

// raised reports whether err is the script's raise of msg.
func raised(err error, msg string) bool {
	got, ok := scriptreply.Raised(err)
	return ok && got == msg
}
