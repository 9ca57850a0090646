-- poll.lua: a queued caller asks for its slot. A slot is consumed by the
-- poll that finds it: it cannot be used twice.
--
-- A caller of the bucket's own costs that finds its slot ahead claims,
-- in exchange, a slot of the due set whose caller did not come for it
-- (claim.lua), if there is one in its window; one still queued takes
-- such a slot and leaves the queue (its ticket counted as done), or,
-- when its own turn is further off, the tokens the books have held
-- unpromised for the claim window's near end (protocol.ClaimAfter, 3 ms)
-- or more, whose callers at the head of
-- the queue did not come (claim.lua's take_free). A caller that finds
-- its own slot taken (TAKEN) is told stale, without a room.
--
-- KEYS[1] queue, KEYS[2] state, KEYS[3] slot key prefix, KEYS[4] lock,
-- KEYS[5] config (as in enqueue.lua), KEYS[6] refunds (unused), KEYS[7]
-- due (claim.lua)
-- KEYS[8..11] the lanes' keys (lanes.lua): the caller is looked for in
-- its lane's list, and its estimate counts its lane (and, when named
-- lanes have callers, the lanes that share its class)
-- ARGV[1] caller's entry, "<id>|<estimate>"
-- ARGV[2] tolerance µs: a slot older than this is stale and not handed out
-- ARGV[3], ARGV[4] the claim window, µs back from now: lo, hi
--         (protocol.ClaimWindow; 0, 0 claims nothing)
-- ARGV[5..9] the step's lookahead µs, max callers, grace µs, lead µs and
--         wake channel (as step.lua's), for the help
-- ARGV[10..] policies: configuration id, n, then cap, amount, freq µs, call, kind for each
--
-- Reply {kind, delay µs, position, lock TTL ms, slot[, room]}:
--   kind 1 slot found: start after delay (may be negative: late); 5 the
--   same, the slot claimed from a caller that did not come for it;
--   2 still queued: delay = estimate of the slot, lock TTL as PTTL (-2: no
--   scheduler), slot 1 when the step will tell the caller its slot on the
--   wake channel (it is more than the lead from the entry's estimate:
--   wake_told), else 0; 3 stale: the slot passed more than tolerance
--   ago, or a running caller took it (room ''), the token is spent:
--   retime; 4
--   lost: neither queued nor scheduled (expired, or Redis lost its
--   data), enter again. slot (µs, Redis time) is set for
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
  local _, _, costs = entry_parts(id)
  if not costs then redis.call('ZREM', KEYS[7], id) end -- collected
  if d < -tolerance or room_of(raw) == TAKEN then
    -- A slot taken by a running caller holds nothing for this one: its
    -- caller is served as one too late for it (retime.lua).
    return {3, d, 0, 0, slot, room_of(raw) == TAKEN and '' or room_of(raw)}
  end
  local lo, hi = tonumber(ARGV[3]), tonumber(ARGV[4])
  if not costs and lo > 0 then
    local grace = tonumber(ARGV[7])
    -- The slot key given in exchange expires when this one would have:
    -- grace after its slot (step.lua).
    local c = claim_for(KEYS[2], KEYS[5], KEYS[3], KEYS[7], now, lo, hi, grace, ARGV, 10, id, slot, swap_to(KEYS[7], raw, slot, ceil_ms(slot - now + grace)))
    if c then return c end
  end
  return {1, d, 0, 0, slot, room_of(raw)}
end

local lk = {queue = KEYS[1], prefix = KEYS[8], classes = KEYS[9], class = KEYS[10], tags = KEYS[11]}
local lane, _, prio = lane_of(id)
local qk = lane_list(lk, lane)
local pos = redis.call('LPOS', qk, id)
if not pos then
  return {4, 0, 0, 0, 0}
end
local _, eest, costs = entry_parts(id)
local lo, hi = tonumber(ARGV[3]), tonumber(ARGV[4])
if not costs and lo > 0 then
  -- A caller still queued, whose process runs, takes a slot whose caller
  -- did not come for it (claim.lua), and leaves the queue: that caller
  -- is served as one too late for its slot.
  local c = claim_for(KEYS[2], KEYS[5], KEYS[3], KEYS[7], now, lo, hi, tonumber(ARGV[7]), ARGV, 10, id, now, mark_taken(KEYS[7]))
  if c then
    redis.call('LREM', qk, 1, id)
    lane_left(lk, lane, prio)
    add_done(KEYS[2], 1, nil, KEYS[5], '')
    return c
  end
end
local ps, _, unit, cid = read_policies(ARGV, 10)
local st, done, till = load(KEYS[2], ps, now, KEYS[5], cid)
local est
local on = lanes_on(lk)
local k = on and lane_count(lk, lane, prio, redis.call('LLEN', KEYS[1])) or 1
if unit and st.costed == 0 then
  -- With named lanes, its share of its class's rate: each lane that has
  -- callers counted as far ahead as its own.
  est = slot_all(st, ps, now, (pos + 1) * k)
else
  -- Costs differ: add up those of the callers ahead and the caller's own.
  local ks = {}
  for k = 1, #ps do ks[k] = 0 end
  for _, e in ipairs(redis.call('LRANGE', qk, 0, pos)) do
    local _, _, costs = entry_parts(e)
    for j = 1, #ps do ks[j] = ks[j] + (costs and costs[j] or ps[j].call) * k end
  end
  est = slot_k(st, ps, now, ks)
end
-- With named lanes a caller's estimate is its share's, later than the
-- next slot to give: it helps when that slot is a lookahead overdue, as
-- an arrival does (enqueue.lua).
if est <= now + tonumber(ARGV[5]) or (on and slot_all(st, ps, now, 1) <= now - tonumber(ARGV[5])) then
  -- The caller's slot falls within the lookahead and no step gave it:
  -- the scheduler is late (its process starved or stopped; a step gives
  -- a slot a lookahead before it, the caller polls a lead before). A
  -- caller that runs does the step's work itself (schedule.lua), for
  -- every caller due within the lookahead, and finds its own slot among
  -- them: one poll, not a poll and a back-off until the step comes. The
  -- lock stays the scheduler's: this only saves it the work.
  local keys = {queue = KEYS[1], slot = KEYS[3], refunds = KEYS[6], due = KEYS[7], lanes = lk}
  local scheduled = schedule(keys, now, tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), ARGV[9], ps, unit, cid, st)
  if scheduled > 0 then
    save(KEYS[2], st, ps, now, tonumber(ARGV[7]), done + scheduled, till, KEYS[5])
    raw = redis.call('GET', key)
    if raw then
      redis.call('DEL', key)
      redis.call('ZREM', KEYS[7], (entry_parts(id)))
      local slot = slot_of(raw)
      return {1, slot - now, 0, 0, slot, room_of(raw)}
    end
  end
end
if est > now and not costs and lo > 0 and lane == '' and not on then
  local c = take_free(KEYS[1], st, ps, now, hi, id, cid)
  if c then
    save(KEYS[2], st, ps, now, tonumber(ARGV[7]), done + 1, till, KEYS[5])
    return c
  end
end
-- Its slot moved more than the lead from its entry's estimate (later:
-- callers ahead were late and took the next slots first; earlier: some
-- left): the step will tell it (wake_told).
local told = eest and eest > 0 and wake_told(eest, est, tonumber(ARGV[8])) and 1 or 0
return {2, est - now, pos + 1, redis.call('PTTL', KEYS[4]), told}
