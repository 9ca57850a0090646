-- poll.lua: a queued caller asks for its slot. A slot is consumed by the
-- poll that finds it: it cannot be used twice.
--
-- KEYS[1] queue, KEYS[2] state, KEYS[3] slot key prefix, KEYS[4] lock,
-- KEYS[5] config (as in enqueue.lua)
-- ARGV[1] caller's entry, "<id>|<estimate>"
-- ARGV[2] tolerance µs: a slot older than this is stale and not handed out
-- ARGV[3..] policies: configuration id, n, then cap, amount, freq µs, call, kind for each
--
-- Reply {kind, delay µs, position, lock TTL ms, slot[, room]}:
--   kind 1 slot found: start after delay (may be negative: late);
--   2 still queued: delay = estimate of the slot, lock TTL as PTTL (-2: no
--   scheduler); 3 stale: the slot passed more than tolerance ago, the token
--   is spent, enter again; 4 lost: neither queued nor scheduled (expired, or
--   Redis lost its data), enter again. slot (µs, Redis time) is set for
--   kinds 1 and 3, for analysis only; room (entry.lua's room_of) too, for
--   retime.lua.
local now = now_us()
local id = ARGV[1]
local tolerance = tonumber(ARGV[2])

local key = KEYS[3] .. entry_parts(id)
-- GET then DEL, not GETDEL: a GETDEL in INFO commandstats is then always a
-- client's direct poll (see Queue.Poll), never this script's.
local raw = redis.call('GET', key)
if raw then
  redis.call('DEL', key)
  local slot = slot_of(raw)
  local d = slot - now
  if d < -tolerance then
    return {3, d, 0, 0, slot, room_of(raw)}
  end
  return {1, d, 0, 0, slot, room_of(raw)}
end

local pos = redis.call('LPOS', KEYS[1], id)
if not pos then
  return {4, 0, 0, 0, 0}
end
local ps, _, unit, cid = read_policies(ARGV, 3)
local st = load(KEYS[2], ps, now, KEYS[5], cid)
local est
if unit and st.costed == 0 then
  est = slot_all(st, ps, now, pos + 1)
else
  -- Costs differ: add up those of the callers ahead and the caller's own.
  local ks = {}
  for k = 1, #ps do ks[k] = 0 end
  for _, e in ipairs(redis.call('LRANGE', KEYS[1], 0, pos)) do
    local _, _, costs = entry_parts(e)
    for k = 1, #ps do ks[k] = ks[k] + (costs and costs[k] or ps[k].call) end
  end
  est = slot_k(st, ps, now, ks)
end
return {2, est - now, pos + 1, redis.call('PTTL', KEYS[4]), 0}
