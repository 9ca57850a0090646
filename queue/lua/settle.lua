-- settle.lua: a reservation's true cost, charged once its call has ended
-- (bucket.Reservation's Settle and Cancel; docs/guarantees.md, "Settling").
-- The reservation took its estimate when it was granted; this script
-- corrects every policy at once by the difference.
--
-- A policy charged more than the call used gets the rest back at once:
-- its level rises by it, up to its capacity (the tokens a full bucket
-- cannot hold are lost, as with the provider that counts the same way;
-- a level below zero counts as an empty bucket there, its tokens being
-- promised to slots still to come),
-- and the callers at the head of the queue are the first to have it at
-- the scheduler's next step. The give-back counts in the refunds key
-- (retime.lua's bound on what was given back since a step). A policy
-- charged less takes the rest as a debt: its level falls by it, possibly
-- below zero, and the callers after it wait it out. Slots already handed
-- out (within the lookahead) keep their times.
--
-- KEYS[1] queue, KEYS[2] state, KEYS[3] config (as in enqueue.lua),
-- KEYS[4] refunds (retime.lua)
-- ARGV[1] grace µs added to the state's TTL
-- ARGV[2] the difference per policy, "d1,d2,..." (true cost less the
--         estimate: negative gives back, positive is a debt)
-- ARGV[3] the reservation's slot, µs (0: unknown)
-- ARGV[4..] policies (read_policies)
--
-- A rolling window (tokens.lua, "Windows") logs each grant: its give-back
-- lowers the cost logged at the reservation's slot (nothing once that
-- has left the window, or when the slot is unknown), and its debt is
-- logged now, to leave the window a window from now.
--
-- Reply {tokens given back, tokens lost at capacity, debt}, summed over
-- the policies.
local now = now_us()
local grace = tonumber(ARGV[1])
local ds = parse_costs(ARGV[2]) or {}
local slot = tonumber(ARGV[3])
local ps, _, _, id = read_policies(ARGV, 4)
local st, done, till = load(KEYS[2], ps, now, KEYS[3], id)
local back, lost, debt = 0, 0, 0
local rs

-- window_back lowers by up to want the cost logged for the grant at slot
-- in rolling policy i's log (the earliest entry at or after it: a grant
-- logged behind a later one took that one's slot), and returns how much.
local function window_back(s, p, i, want)
  if slot <= 0 then return 0 end
  local key = log_key(i)
  local hi = redis.call('LLEN', key) - 1
  local at, t0, c0
  while hi >= 0 do
    local lo = math.max(0, hi - 63)
    local chunk = redis.call('LRANGE', key, lo, hi)
    local before = false
    for j = #chunk, 1, -1 do
      local t, c = parse_entry(chunk[j])
      if t < slot then before = true break end
      at, t0, c0 = lo + j - 1, t, c
    end
    if before then break end
    hi = lo - 1
  end
  if not at then return 0 end
  local g = math.min(want, c0)
  redis.call('LSET', key, at, string.format('%d %d', t0, c0 - g))
  s.level = math.min(p.cap, s.level + g)
  return g
end

for i = 1, #ps do
  local d, s = ds[i] or 0, st[i]
  if d > 0 and ps[i].kind == ROLLING then
    local ks = {}
    for j = 1, #ps do ks[j] = 0 end
    ks[i] = d
    window_record(st, ps, now, ks)
    s.level = s.level - d
    debt = debt + d
  elseif d < 0 and ps[i].kind == ROLLING then
    local g = window_back(s, ps[i], i, -d)
    back, lost = back + g, lost + (-d - g)
  elseif d > 0 then
    s.level = s.level - d
    debt = debt + d
  elseif d < 0 then
    -- A negative level is tokens promised to slots still to come, which
    -- refills still to come will bring: the bucket holds none now, and
    -- what comes back fills it from empty, up to its capacity.
    local g = math.max(0, math.min(-d, ps[i].cap - math.max(s.level, 0)))
    s.level = s.level + g
    back, lost = back + g, lost + (-d - g)
    if g > 0 then
      rs = rs or parse_costs(redis.call('GET', KEYS[4]) or '') or {}
      for k = 1, #ps + 1 do rs[k] = rs[k] or 0 end
      rs[i + 1] = rs[i + 1] + g
    end
  end
end
if rs then
  local out = {}
  for k = 1, #rs do out[k] = string.format('%d', rs[k]) end
  redis.call('SET', KEYS[4], table.concat(out, ','), 'PX', ceil_ms(3 * grace))
end
if back > 0 then
  -- The tokens back raise the levels from now on: so do the peaks
  -- (peaks.lua), which judge what a late or leaving caller may take back.
  local gs = {}
  for i = 1, #ps do gs[i] = math.max(0, -(ds[i] or 0)) end
  peaks_raise(st, ps, now, gs)
end
if back > 0 or debt > 0 then
  save(KEYS[2], st, ps, now, grace, done, till, KEYS[3])
end
return {back, lost, debt}
