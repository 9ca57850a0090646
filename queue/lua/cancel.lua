-- cancel.lua: callers give up their places, one or many at once. A caller
-- still queued leaves it (no token spent). One whose slot was written
-- (the scheduler's step gave it; its poll may have read it) passes its
-- tokens on: they go back to the bucket when that is exact (refund.lua),
-- and the next step hands them to the next caller in line.
--
-- KEYS[1] queue, KEYS[2] slot key prefix, KEYS[3] state, KEYS[4] config,
-- KEYS[5] refunds (as in retime.lua)
-- ARGV[1] grace µs added to the state's TTL
-- ARGV[2..] policies: configuration id, n, then cap, amount, freq µs, call, kind for each
-- ARGV[after policies] for each caller three values: its entry
--         ("<id>|<estimate>[|<costs>]"), or its bare ID when the caller
--         gave up before its enqueue's reply told it the entry (then the
--         queue is searched for it: a rare path, O(queue length)), or ""
--         for a caller given its slot at arrival; the room of the slot it
--         read ("" for none); and its costs, "c1,c2,..." ("": those its
--         entry names, or each policy's call)
--
-- Reply, one per caller: 0 removed from the queue before it had a slot:
-- no token spent; 1 it had a slot, whose tokens stay spent (giving them
-- back was not exact); 2 unknown (already consumed without a room,
-- expired, or never arrived); 3 it had a slot, whose tokens went back.
local function find(prefix, list)
  for _, e in ipairs(list) do
    if string.sub(e, 1, #prefix) == prefix then
      return e
    end
  end
end

local grace = tonumber(ARGV[1])
local ps, i, _, cid = read_policies(ARGV, 2)
local out = {}
local removed = 0
local less = nil
local rooms = {} -- {reply index, room, costs} of callers whose slot was written
for c = 1, (#ARGV - i + 1) / 3 do
  local entry, room, costs = ARGV[i + 3 * c - 3], ARGV[i + 3 * c - 2], parse_costs(ARGV[i + 3 * c - 1])
  local id, est = entry_parts(entry)
  if entry == '' then
    entry = nil
  elseif not est then -- a bare ID
    entry = find(id .. '|', redis.call('LRANGE', KEYS[1], 0, -1))
  end
  if entry and not costs then
    _, _, costs = entry_parts(entry)
  end
  if entry and redis.call('LREM', KEYS[1], 1, entry) == 1 then
    out[c] = 0
    removed = removed + 1
    if costs then
      less = less or {costed = 0}
      less.costed = less.costed + 1
      for k = 1, #ps do less[k] = (less[k] or 0) + costs[k] - ps[k].call end
    end
  else
    local raw = id ~= '' and redis.call('GET', KEYS[2] .. id)
    if raw then
      redis.call('DEL', KEYS[2] .. id)
      room = room_of(raw)
    end
    if room ~= '' then
      out[c] = 1
      rooms[#rooms + 1] = {c, room, costs}
    else
      out[c] = raw and 1 or 2
    end
  end
end
if #rooms > 0 then
  local now = now_us()
  local st, done, till, fresh = load(KEYS[3], ps, now, KEYS[4], cid)
  local raw_r, rs = read_refunds(KEYS[5], #ps)
  local back = false
  for _, r in ipairs(rooms) do
    local ks = {}
    for k = 1, #ps do ks[k] = r[3] and r[3][k] or ps[k].call end
    local ok
    ok, raw_r = give_back(st, ps, now, grace, r[2], ks, KEYS[5], raw_r, rs, cid)
    if ok then out[r[1]], back = 3, true end
  end
  -- The callers who left the queue, as add_done counts them.
  if less then
    st.costed = st.costed - less.costed
    for k = 1, #ps do st[k].extra = st[k].extra - less[k] end
  end
  if back or not fresh then -- a state that was missing stays so
    save(KEYS[3], st, ps, now, grace, done + removed, till, KEYS[4])
  end
elseif removed > 0 then
  -- The state's done counts tickets no longer queued, so that the next
  -- caller's ticket (done + its position) stays unique: leave it the rest.
  add_done(KEYS[3], removed, less, KEYS[4], cid)
end
return out
