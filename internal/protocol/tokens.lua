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

-- read_policies parses "id, n, cap1, amount1, freq1, call1, ..." from argv
-- at index i and returns the policies, the index after them, whether every
-- policy counts calls (then a caller without costs takes one token of
-- each, and the scalar functions below serve), and id, the configuration
-- they make (config.go), which the state must carry (state.lua).
local function read_policies(argv, i)
  local id = argv[i]
  local n = tonumber(argv[i + 1])
  local ps, unit = {}, true
  for k = 1, n do
    local b = i + 2 + (k - 1) * 4
    ps[k] = {cap = tonumber(argv[b]), amount = tonumber(argv[b + 1]), freq = tonumber(argv[b + 2]), call = tonumber(argv[b + 3])}
    if ps[k].call ~= 1 then unit = false end
  end
  return ps, i + 2 + n * 4, unit, id
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

-- slot_for is the earliest instant at which a policy at (level, anchor) can
-- give the k-th token from now on (k = 1 for the next caller, 2 for the one
-- after it, ...), assuming no caller ahead gives its token back.
local function slot_for(level, anchor, now, k, amount, freq)
  if level >= k then
    return now
  end
  return anchor + math.ceil((k - level) / amount) * freq
end

-- A hold (st.hold, µs; state.lua) keeps every slot that takes from a held
-- policy at or after it: st.held is a bitmask of the held policies (bit 0
-- the first), 0 meaning all. feedback.lua, which sets it, also moves each
-- held policy's anchor to the hold's end: it gains nothing during the hold
-- and keeps the tokens it had, so holding a slot back to the hold's end is
-- all there is to it, and the slots after it come at the policy's pace.

-- held says whether the hold keeps a slot that takes ks (nil: one of
-- every policy) at or after st.hold.
local function held(st, ks)
  if (st.hold or 0) == 0 then return false end
  if st.held == 0 or not ks then return true end
  for i = 1, #ks do
    if ks[i] > 0 and bit.band(st.held, 2 ^ (i - 1)) ~= 0 then return true end
  end
  return false
end

-- slot_all is the slot of the k-th token across every policy (every
-- caller takes from each: any hold applies).
local function slot_all(st, ps, now, k)
  local slot = now
  if #ps == 1 then -- the common case, without a loop
    local s, p = st[1], ps[1]
    if s.level < k then
      slot = math.max(now, s.anchor + math.ceil((k - s.level) / p.amount) * p.freq)
    end
  else
    for i = 1, #ps do
      local p = ps[i]
      local s = slot_for(st[i].level, st[i].anchor, now, k, p.amount, p.freq)
      if s > slot then slot = s end
    end
  end
  if (st.hold or 0) > slot then slot = st.hold end
  return slot
end

-- take spends one token of every policy.
local function take(st)
  for i = 1, #st do
    st[i].level = st[i].level - 1
  end
end

-- slot_k is the slot at which every policy i can give its ks[i]-th token
-- from now on. A policy with ks[i] = 0 still holds the slot back until the
-- tokens it promised are due, so slots never go backwards: no caller
-- overtakes one ahead of it, whatever their costs.
local function slot_k(st, ps, now, ks)
  local slot = now
  for i = 1, #ps do
    local p = ps[i]
    local s = slot_for(st[i].level, st[i].anchor, now, ks[i], p.amount, p.freq)
    if s > slot then slot = s end
  end
  if (st.hold or 0) > slot and held(st, ks) then slot = st.hold end
  return slot
end

-- take_k spends ks[i] tokens of every policy i.
local function take_k(st, ks)
  for i = 1, #st do
    st[i].level = st[i].level - ks[i]
  end
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
