-- tokens.lua: the token arithmetic every bucket script shares (its Go twin is
-- tokens.go); prepended to a script with protocol.Script, so it declares no
-- KEYS or ARGV of its own.
--
-- Units: every time is an integer number of microseconds on the Redis clock
-- (TIME), every duration an integer number of microseconds. Levels are
-- integer token counts and may go negative: a negative level is tokens
-- already promised to callers whose slots lie in the future.
--
-- A bucket has one or more policies, each {cap, amount, freq}: it holds at
-- most cap tokens and gains amount tokens every freq microseconds. A caller
-- needs one token from every policy; its slot is the latest of the times at
-- which each policy can give it.

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

-- read_policies parses "n, cap1, amount1, freq1, ..." from argv at index i
-- and returns the policies and the index after them.
local function read_policies(argv, i)
  local n = tonumber(argv[i])
  local ps = {}
  for k = 1, n do
    local b = i + 1 + (k - 1) * 3
    ps[k] = {cap = tonumber(argv[b]), amount = tonumber(argv[b + 1]), freq = tonumber(argv[b + 2])}
  end
  return ps, i + 1 + n * 3
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

-- slot_all is the slot of the k-th token across every policy.
local function slot_all(st, ps, now, k)
  if #ps == 1 then -- the common case, without a loop
    local s, p = st[1], ps[1]
    if s.level >= k then return now end
    local slot = s.anchor + math.ceil((k - s.level) / p.amount) * p.freq
    if slot > now then return slot end
    return now
  end
  local slot = now
  for i = 1, #ps do
    local p = ps[i]
    local s = slot_for(st[i].level, st[i].anchor, now, k, p.amount, p.freq)
    if s > slot then slot = s end
  end
  return slot
end

-- take spends one token of every policy.
local function take(st)
  for i = 1, #st do
    st[i].level = st[i].level - 1
  end
end
