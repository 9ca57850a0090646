-- tokens.lua: the token arithmetic every bucket script shares (its Go twin is
-- tokens.go); prepended to a script with protocol.Script, so it declares no
-- KEYS or ARGV of its own.
--
-- Units: every time is an integer number of microseconds on the Redis clock
-- (TIME), every duration an integer number of microseconds. Levels are
-- integer token counts and may go negative: a negative level is tokens
-- already promised to callers whose slots lie in the future.
--
-- A bucket has one or more policies, each {cap, amount, freq, call}: it
-- holds at most cap tokens and gains amount tokens every freq microseconds.
-- A caller costs each policy some tokens: its own costs, one per policy, or
-- else call tokens of each (1 for a policy counting calls, 0 for one
-- counting another unit). Its slot is the latest of the times at which each
-- policy can give it its cost, after the callers ahead of it.

-- Redis TIME as integer microseconds.
local function now_us()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- int formats an integer-valued number without the %.14g rounding that Lua
-- applies when it turns a number into a string: a µs timestamp has 16 digits.
local function int(x)
  return string.format('%d', x)
end

-- ceil_ms turns a positive µs duration into whole milliseconds for PEXPIRE.
local function ceil_ms(us)
  local ms = math.ceil(us / 1000)
  if ms < 1 then ms = 1 end
  return int(ms)
end

-- read_policies parses "id, n, cap1, amount1, freq1, call1, kind1, ..."
-- from argv at index i and returns the policies, the index after them,
-- whether every policy counts calls (then a caller without costs takes one
-- token of each, and the scalar functions below serve), and id, the
-- configuration they make (config.go), which the state must carry
-- (state.lua). kind is 0 for a token bucket, FIXED or ROLLING for a window
-- (below, "Windows"); ps.rolling counts the rolling ones.
local FIXED, ROLLING = 1, 2
local function read_policies(argv, i)
  local id = argv[i]
  local n = tonumber(argv[i + 1])
  local ps, unit = {rolling = 0}, true
  for k = 1, n do
    local b = i + 2 + (k - 1) * 5
    ps[k] = {cap = tonumber(argv[b]), amount = tonumber(argv[b + 1]), freq = tonumber(argv[b + 2]), call = tonumber(argv[b + 3]), kind = tonumber(argv[b + 4])}
    if ps[k].call ~= 1 then unit = false end
    if ps[k].kind == ROLLING then ps.rolling = ps.rolling + 1 end
  end
  return ps, i + 2 + n * 5, unit, id
end

-- Windows. A fixed window (kind FIXED) of N per W is a token bucket of
-- capacity N that gains N every W: each refill resets it to N, less the
-- tokens already promised to slots past the refill. Its grid is whole
-- multiples of W on the Redis clock, plus a lag (state.lua's
-- fixed_anchor), so that its windows are the upstream's when that one
-- counts per calendar minute, hour or day.
--
-- A rolling window (kind ROLLING) of N per W grants at most N in any
-- closed window of length W (freq holds W): each grant's tokens come back
-- W plus a lag after its slot (window_span), the lag being a margin for
-- the jitter between a slot and the upstream's arrival of its request. Its grants are logged, in slot
-- order, in a list key of its own ("<base>window:<i>", log_key): entries
-- "slot cost", one per slot (grants of the same slot merged). Its state's
-- level is N less the costs logged and not yet expired (refilled by
-- expiring them: window_refill), its anchor the slot of the last entry
-- logged (0: none), which bounds when the log empties.

-- REFILL_LAG_US is the longest lag (µs) of a grant behind its slot that
-- the books allow for: a token bucket's refill lag (refill_lag, below), a
-- rolling window's (window_span) and a new bucket's (state.lua's
-- FRESH_LAG_US). protocol.RefillLagMax is its Go twin.
local REFILL_LAG_US = 5000

-- window_span is how long after its slot a rolling window's grant still
-- counts: its window W plus a lag of min(W / 2, REFILL_LAG_US), as a new
-- bucket's refills lag (state.lua's FRESH_LAG_US): an upstream that
-- counts requests as they arrive sees one start a little after its slot,
-- and the next one after the window must not arrive before it leaves.
local function window_span(p)
  return p.freq + math.min(math.floor(p.freq / 2), REFILL_LAG_US)
end

-- MAX_WALK bounds how many log entries window_slot reads: past them its
-- answer is a lower bound (an estimate), never a slot granted, since a
-- window is longer than the lookahead (bucket.New checks it).
local MAX_WALK = 256

-- The log keys' prefix, set by load from the state key: every key of a
-- bucket shares its hash tag, as the slot keys share the declared prefix.
local LOG_BASE = nil

local function log_key(i)
  return LOG_BASE .. i
end

local function parse_entry(e)
  local t, c = string.match(e, '^(%-?%d+) (%-?%d+)$')
  return tonumber(t), tonumber(c)
end

-- window_refill gives a rolling policy's level back the tokens of the
-- entries whose window has passed at now. It only reads: the entries
-- leave the log when save writes the level (s.skip of them), so that a
-- script that saves nothing leaves log and level as they were.
local function window_refill(s, p, i, now)
  s.log, s.skip, s.log_end = {}, 0, false
  while true do
    local chunk = redis.call('LRANGE', log_key(i), s.skip, s.skip + 63)
    local stop = false
    for _, e in ipairs(chunk) do
      local t, c = parse_entry(e)
      if stop or t + window_span(p) >= now then
        stop = true
        s.log[#s.log + 1] = {t, c}
      else
        s.skip = s.skip + 1
        s.level = math.min(p.cap, s.level + c)
      end
    end
    if #chunk < 64 then s.log_end = true end
    if stop or #chunk < 64 then break end
  end
  if s.level >= p.cap and s.log_end and #s.log == 0 then s.anchor = 0 end
end

-- window_entries returns the first m entries of policy i's log that are
-- still in the window (read by window_refill, then as needed, once per
-- script).
local function window_entries(s, i, m)
  local have = #s.log
  if have < m and not s.log_end then
    local from = s.skip + have
    local chunk = redis.call('LRANGE', log_key(i), from, from + m - have - 1)
    for _, e in ipairs(chunk) do
      local t, c = parse_entry(e)
      s.log[#s.log + 1] = {t, c}
    end
    if #chunk < m - have then s.log_end = true end
  end
  return s.log
end

-- window_slot is the earliest instant at which a rolling policy can give
-- its k-th token from now on: when enough logged grants have left the
-- window. Past the log (or MAX_WALK entries), the tokens needed come
-- back from grants not made yet, whose slots are now or later: the
-- answer is then a lower bound.
local function window_slot(s, p, i, now, k)
  if s.level >= k then return now end
  local need, acc = k - s.level, 0
  local m = 16
  local log = window_entries(s, i, m)
  local j, last = 0, now
  while true do
    j = j + 1
    if j > #log then
      if s.log_end or j > MAX_WALK then break end
      m = math.min(m * 4, MAX_WALK)
      log = window_entries(s, i, m)
      if j > #log then break end
    end
    local t, c = log[j][1], log[j][2]
    last = t
    acc = acc + c
    if acc >= need then return math.max(now, t + window_span(p) + 1) end
  end
  return math.max(now, last) + window_span(p) + 1
end

-- window_record logs a grant of ks (nil: call each) at slot, for every
-- rolling policy it takes from; save writes it to the log.
local function window_record(st, ps, slot, ks)
  if ps.rolling == 0 then return end
  for i = 1, #ps do
    local p = ps[i]
    local c = ks and ks[i] or p.call
    if p.kind == ROLLING and c > 0 then
      local s = st[i]
      local t = math.max(slot, s.anchor) -- the log stays in slot order
      s.pend = s.pend or {}
      local last = s.pend[#s.pend]
      if last and last[1] == t then
        last[2] = last[2] + c
      else
        s.pend[#s.pend + 1] = {t, c}
      end
      s.anchor = t
    end
  end
end

-- refill brings one policy's (level, anchor) forward to now. anchor is the
-- instant of the last refill counted; refills happen at anchor + k*freq. A
-- missing state is a new, full bucket whose first refill is freq from now.
local function refill(level, anchor, now, cap, amount, freq)
  if level == nil or anchor == nil then
    return cap, now
  end
  if now > anchor then
    local d = now - anchor
    local n = math.floor(d / freq)
    -- Guard the float division against rounding up across an integer.
    if n * freq > d then n = n - 1 end
    if n > 0 then
      level = math.min(cap, level + n * amount)
      anchor = anchor + n * freq
    end
  end
  return level, anchor
end

-- The refill lag. A grant that finds a token bucket full starts its
-- refills a lag after its slot (take_at: a new bucket's first grant too,
-- and a bucket full again after idling; one nearly full, a little less):
-- an upstream that keeps the same books, full too, loses its refills
-- until the request arrives, and starts them then. The lag is the
-- same for every process (it follows from the policy, part of the
-- configuration's id) and is stored as the anchor: earlier versions read
-- it as any anchor. REFILL_LAG_US (5 ms) covers a request's trip, cold
-- connections included; for a policy that refills from empty in less
-- than twice that, the lag is half that time, as a rolling window's
-- (window_span): a bucket that fills between every two grants pays the
-- lag at each, at most a third of its rate.

-- refill_lag is a token bucket's lag, µs: min(fill / 2, REFILL_LAG_US),
-- fill being how long it takes to refill from empty, ceil(cap / amount)
-- periods.
local function refill_lag(p)
  if p.amount < 1 then return REFILL_LAG_US end
  return math.min(math.floor(math.ceil(p.cap / p.amount) * p.freq / 2), REFILL_LAG_US)
end

-- slot_for is the earliest instant at which a policy at (level, anchor) can
-- give the k-th token from now on (k = 1 for the next caller, 2 for the one
-- after it, ...), assuming no caller ahead gives its token back.
local function slot_for(level, anchor, now, k, amount, freq)
  if level >= k then
    return now
  end
  return anchor + math.ceil((k - level) / amount) * freq
end

-- lag_shift is how far (µs) a grant at slot moves a policy's grid of
-- refills (take_at), before being its level at the slot and at its last
-- refill by then. The request may find the upstream full up to a lag
-- after the slot, and its refills start then: ours may come no more
-- refills ahead of the upstream's than the room the grant found, whole
-- refills of it. So the grid moves to slot + lag less those periods: a
-- full bucket's next refill comes at slot + lag + freq, and one a lag of
-- refills or more below its capacity is not moved. A grant at the very
-- refill that filled it (at = slot: a saturated bucket whose capacity is
-- one refill, granting each token as it comes) moves nothing: the bucket
-- never sat full, and moving its grid at every grant would cost it up to
-- a third of its rate (a capacity of 1 at 250/s granted 167/s). An
-- upstream that restarts its refills when a request finds it full then
-- counts on the requests arriving no later after their slots than the
-- one before them did.
local function lag_shift(p, before, slot, at)
  if p.kind ~= 0 or at == slot then return 0 end
  local back = math.floor((p.cap - before) / p.amount) * p.freq
  return math.max(0, slot + refill_lag(p) - back - at)
end

-- slot_anchor is what a grant at slot leaves of a token bucket policy p's
-- grid (state s just after the grant), for refund.lua: the books count
-- no refill after the slot, and count the next one at the first point of
-- s.anchor + k*freq past it, when the last refill they counted by then,
-- at, came no later than the slot. An anchor past the slot is then the
-- lag's shift, which adds no token: the next refill is a period after
-- it. false when at is past the slot (a grant of another script counted
-- refills up to a later slot already) or p is no token bucket.
local function slot_anchor(p, s, slot, at)
  if p.kind ~= 0 or at > slot then return false end
  return s.anchor
end

-- lag_anchor is the anchor slot_for counts from for a policy at (level,
-- anchor) at now, for a token past the level: a full token bucket's
-- next grant, now, moves its refills to a lag after now (lag_shift).
-- Only estimates ask for more than a full bucket holds: a grant's own
-- slot never waits for the refills its own lag moves.
local function lag_anchor(p, level, anchor, now)
  if p.kind == 0 and level >= p.cap then return math.max(anchor, now + refill_lag(p)) end
  return anchor
end

-- policy_slot is slot_for for policy i of any kind.
local function policy_slot(st, ps, i, now, k)
  local p, s = ps[i], st[i]
  if p.kind == ROLLING then return window_slot(s, p, i, now, k) end
  return slot_for(s.level, lag_anchor(p, s.level, s.anchor, now), now, k, p.amount, p.freq)
end

-- A hold (st.hold, µs; state.lua) keeps every slot that takes from a held
-- policy at or after it: st.held is a bitmask of the held policies (bit 0
-- the first), 0 meaning all. feedback.lua, which sets it, also moves each
-- held policy's anchor to the hold's end: it gains nothing during the hold
-- and keeps the tokens it had, so holding a slot back to the hold's end is
-- all there is to it, and the slots after it come at the policy's pace.

-- has_bit says whether bit i (1: the lowest) of mask is set. Arithmetic,
-- not bit.band: miniredis's Lua has no bit library.
local function has_bit(mask, i)
  return math.floor(mask / 2 ^ (i - 1)) % 2 == 1
end

-- held says whether the hold keeps a slot that takes ks (nil: one of
-- every policy) at or after st.hold.
local function held(st, ks)
  if (st.hold or 0) == 0 then return false end
  if st.held == 0 or not ks then return true end
  for i = 1, #ks do
    if ks[i] > 0 and has_bit(st.held, i) then return true end
  end
  return false
end

-- slot_all is the slot of the k-th token across every policy (every
-- caller takes from each: any hold applies).
local function slot_all(st, ps, now, k)
  local slot = now
  if #ps == 1 and ps.rolling == 0 then -- the common case, without a loop
    local s, p = st[1], ps[1]
    if s.level < k then
      slot = math.max(now, lag_anchor(p, s.level, s.anchor, now) + math.ceil((k - s.level) / p.amount) * p.freq)
    end
  else
    for i = 1, #ps do
      local s = policy_slot(st, ps, i, now, k)
      if s > slot then slot = s end
    end
  end
  if (st.hold or 0) > slot then slot = st.hold end
  return slot
end

-- slot_k is the slot at which every policy i can give its ks[i]-th token
-- from now on. A policy with ks[i] = 0 still holds the slot back until the
-- tokens it promised are due, so slots never go backwards: no caller
-- overtakes one ahead of it, whatever their costs.
local function slot_k(st, ps, now, ks)
  local slot = now
  for i = 1, #ps do
    local s = policy_slot(st, ps, i, now, ks[i])
    if s > slot then slot = s end
  end
  if (st.hold or 0) > slot and held(st, ks) then slot = st.hold end
  return slot
end

-- lag_peak is the most a bucket without the refill lag could hold at
-- slot, for a policy whose books hold before there, their last refill by
-- then at at: a grant that found the books full or nearly moved their
-- refills up to a lag later (lag_shift), so such a bucket may already
-- hold the refills the books count in (slot, slot + lag]. The peaks note
-- it, so that the tokens a late or leaving caller takes back (refund.lua)
-- are judged against what the bucket may really have held, lag or none:
-- at saturation with refills a lag or more apart, each grant at its
-- refill, it is the books' level itself.
local function lag_peak(p, before, slot, at)
  if p.kind ~= 0 then return before end
  local n = math.floor((slot + refill_lag(p) - at) / p.freq)
  if n <= 0 then return before end
  return math.min(p.cap, before + n * p.amount)
end

-- note_peak notes that policy i held level v at slot, just before a grant
-- took from it: a script saves the highest it noted per policy, with the
-- latest slot, in the state's peaks (state.lua, "Peaks").
local function note_peak(st, i, v, slot)
  local pv = st.pv
  if not pv then
    pv = {}
    st.pv = pv
  end
  if not pv[i] or v > pv[i] then pv[i] = v end
  if not st.pt or slot > st.pt then st.pt = slot end
end

-- take_at spends, at slot, ks[i] tokens of every policy i (nil: call
-- each). A policy that has them before slot (another policy or a hold set
-- the slot later) keeps gaining refills until the slot, and a full one
-- loses what it cannot hold: the tokens leave it at the slot, not now. So
-- the refills it will lose by then are taken off its level too, now,
-- which leaves it, at the slot, exactly as it will be there; before the
-- slot it counts fewer tokens than it has, which costs nobody anything,
-- since no caller after this one comes before its slot.
--
-- A token bucket full at the slot starts its refills a lag after it
-- (refill_lag), one nearly full a little less (lag_shift): its grid
-- moves so that the refill that filled it, at or before the slot, comes
-- that much later, and every refill after it with it. When the bucket
-- was full now already (the usual case: a grant at once, after idling or
-- new) its next refill comes at slot + lag + freq, exactly. When it fills
-- by a later slot (a scheduler's step), the refills until then come later
-- too: until slot + lag its level counts a refill fewer than it holds
-- (the grants at the slot borrow it), and exactly what it holds after.
--
-- It also notes, for the state's peaks (state.lua, "Peaks"), each
-- policy's level at the slot before the grant: the highest the bucket
-- holds since the grant before it.
--
-- It returns, per policy, the slot's anchor (slot_anchor): what the slot's
-- room keeps (entry.lua's slot_value) for refund.lua.
local function take_at(st, ps, slot, ks, now)
  local as = {}
  for i = 1, #ps do
    local p, s = ps[i], st[i]
    local k = ks and ks[i] or p.call
    if k > 0 then
      local before, at = s.level, s.anchor -- at: the last refill by the slot
      if p.kind ~= ROLLING and slot > now and slot > s.anchor then
        local level, anchor = refill(s.level, s.anchor, slot, p.cap, p.amount, p.freq)
        local gained = (anchor - s.anchor) / p.freq * p.amount
        s.level = s.level - (s.level + gained - level) -- the refills lost to the capacity
        before, at = level, anchor
      end
      note_peak(st, i, lag_peak(p, before, slot, at), slot)
      s.anchor = s.anchor + lag_shift(p, before, slot, at)
      s.level = s.level - k
      as[i] = slot_anchor(p, s, slot, at)
    else
      as[i] = false
    end
  end
  return as
end

-- ahead_k is, per policy, the tokens that n queued callers (with the
-- extra tokens over call each of those with costs, st[i].extra) and then
-- costs (nil: call each) need: ks for slot_k.
local function ahead_k(st, ps, n, costs)
  local ks = {}
  for i = 1, #ps do
    ks[i] = n * ps[i].call + (st[i].extra or 0) + (costs and costs[i] or ps[i].call)
  end
  return ks
end
