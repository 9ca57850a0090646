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
-- ARGV[3..] policies (read_policies)
--
-- Reply {tokens given back, tokens lost at capacity, debt}, summed over
-- the policies.
local now = now_us()
local grace = tonumber(ARGV[1])
local ds = parse_costs(ARGV[2]) or {}
local ps, _, _, id = read_policies(ARGV, 3)
local st, done, till = load(KEYS[2], ps, now, KEYS[3], id)
local back, lost, debt = 0, 0, 0
local rs
for i = 1, #ps do
  local d, s = ds[i] or 0, st[i]
  if d > 0 then
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
if back > 0 or debt > 0 then
  save(KEYS[2], st, ps, now, grace, done, till, KEYS[3])
end
return {back, lost, debt}
