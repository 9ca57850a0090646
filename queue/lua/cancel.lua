-- cancel.lua: callers give up their places, one or many at once. A caller
-- still queued leaves it (no token spent). One whose slot was written (the
-- scheduler's step gave it; its poll may have read it) passes the slot on,
-- when it is still ahead by more than the lead: the next caller in line
-- takes it as it is (its tokens, its instant, its room), and is told on
-- the wake channel. The grants keep the very instants the steps gave them,
-- so the limit is kept by construction. Otherwise (the slot is too close
-- or past, nobody waits, or the next caller costs more) the slot's tokens
-- go back to the bucket when that is exact, as a late caller's do
-- (refund.lua), and stay spent when it is not: never an excess.
--
-- KEYS[1] queue, KEYS[2] slot key prefix, KEYS[3] state, KEYS[4] config
-- (as in enqueue.lua), KEYS[5] refunds: tokens given back are counted
-- there, per policy, after the upstream's changes (the field before),
-- for the processes of the previous version, whose late callers' bound
-- counts them
-- KEYS[6..8] the prefix of the named lanes' lists, the set of classes
-- and the prefix of the classes' sets (lanes.lua): a caller leaves its
-- lane's list (a lane left empty leaves its class), and its slot passes
-- to the next caller in its lane
-- ARGV[1] grace µs: a slot key outlives its slot by this
-- ARGV[2] lead µs: a slot passes on only if it is at least this far ahead
-- ARGV[3] wake channel
-- ARGV[4..] policies: configuration id, n, then cap, amount, freq µs, call, kind for each
-- ARGV[after policies] for each caller three values: its entry
--         ("<id>|<estimate>[|<costs>]"), or its bare ID when the caller
--         gave up before its enqueue's reply told it the entry (then the
--         queue is searched for it: a rare path, O(queue length)), or ""
--         for a caller given its slot at arrival; the slot key's value it
--         read ("<slot µs> <room>", entry.lua; "" for none); and its costs,
--         "c1,c2,..." ("": those its entry names, or each policy's call)
--
-- Reply, one per caller: 0 removed from the queue before it had a slot:
-- no token spent; 1 it had a slot, whose tokens stay spent; 2 unknown
-- (already consumed without a slot value, expired, or never arrived); 3 it
-- had a slot, which the next caller in line took; 4 it had a slot, whose
-- tokens went back to the bucket.
local function find(prefix, list)
  for _, e in ipairs(list) do
    if string.sub(e, 1, #prefix) == prefix then
      return e
    end
  end
end

-- GONE in a leaver's slot key marks a slot already given up. It is no
-- slot value: a poll that read it would fail, and only the caller that
-- left polls that key.
local GONE = 'gone'

local now = now_us()
local lk = {queue = KEYS[1], prefix = KEYS[6], classes = KEYS[7], class = KEYS[8]}
local emptied = {} -- the named lanes callers left: out of their class if empty now
local grace, lead, channel = tonumber(ARGV[1]), tonumber(ARGV[2]), ARGV[3]
local ps, i, _, cid = read_policies(ARGV, 4)
local out = {}
local removed = 0
local less = nil
local wake = {}
local st, done, till -- the state, loaded by the first caller whose tokens may go back
-- fewer takes a queued caller of entry e off the state's extras, if it has
-- costs of its own.
local function fewer(e)
  removed = removed + 1
  local _, _, costs = entry_parts(e)
  if costs then
    less = less or {costed = 0}
    less.costed = less.costed + 1
    for k = 1, #ps do less[k] = (less[k] or 0) + costs[k] - ps[k].call end
  end
end
for c = 1, (#ARGV - i + 1) / 3 do
  local entry, value, costs = ARGV[i + 3 * c - 3], ARGV[i + 3 * c - 2], parse_costs(ARGV[i + 3 * c - 1])
  local id, est = entry_parts(entry)
  local lane, _, prio = lane_of(id)
  local qk = lane_list(lk, lane)
  if lane ~= '' then emptied[lane] = prio end
  if entry == '' then
    entry = nil
  elseif not est then -- a bare ID
    entry = find(id .. '|', redis.call('LRANGE', qk, 0, -1))
  end
  if entry and not costs then
    _, _, costs = entry_parts(entry)
  end
  if entry and redis.call('LREM', qk, 1, entry) == 1 then
    out[c] = 0
    fewer(entry)
  else
    local raw = id ~= '' and redis.call('GET', KEYS[2] .. id)
    if raw == GONE or (raw and room_of(raw) == TAKEN) then
      value = '' -- it left before, or a running caller took its slot
    elseif raw then
      value = raw
    end
    out[c] = (raw or value ~= '') and 1 or 2
    local slot = value ~= '' and slot_of(value)
    if slot and id ~= '' then
      -- Its slot key says it left, until the slot is long past: a second
      -- cancel of the same caller (a batch sent again) passes nothing on.
      redis.call('SET', KEYS[2] .. id, GONE, 'PX', ceil_ms(math.max(slot - now, 0) + grace))
    end
    local next_one = slot and slot - now >= lead and redis.call('LINDEX', qk, 0)
    if next_one then
      -- The next caller takes the slot only if it needs no more of any
      -- policy than the slot holds.
      local _, _, theirs = entry_parts(next_one)
      local fits = true
      for k = 1, #ps do
        local have = costs and costs[k] or ps[k].call
        local need = theirs and theirs[k] or ps[k].call
        if need > have then fits = false end
      end
      if fits then
        redis.call('LPOP', qk)
        fewer(next_one)
        local nid = entry_parts(next_one)
        redis.call('SET', KEYS[2] .. nid, value, 'PX', ceil_ms(slot - now + grace))
        wake_add(wake, next_one, slot)
        out[c] = 3
      end
    end
    if slot and out[c] == 1 then
      if not st then st, done, till = load(KEYS[3], ps, now, KEYS[4], cid) end
      local ks = {}
      for k = 1, #ps do ks[k] = costs and costs[k] or ps[k].call end
      if unused_back(st, ps, now, grace, value, ks, cid) then
        out[c] = 4
        local rs = parse_costs(redis.call('GET', KEYS[5]) or '') or {}
        for k = 1, #ps + 1 do rs[k] = string.format('%d', (rs[k] or 0) + (ks[k - 1] or 0)) end
        redis.call('SET', KEYS[5], table.concat(rs, ','), 'PX', ceil_ms(3 * grace))
      end
    end
  end
end
wake_publish(channel, wake)
for lane, prio in pairs(emptied) do lane_left(lk, lane, prio) end
-- The state's done counts tickets no longer queued, so that the next
-- caller's ticket (done + its position) stays unique: leave it the rest.
if st then
  if less then
    st.costed = st.costed - less.costed
    for k = 1, #ps do st[k].extra = st[k].extra - (less[k] or 0) end
  end
  save(KEYS[3], st, ps, now, grace, done + removed, till, KEYS[4])
elseif removed > 0 then
  add_done(KEYS[3], removed, less, KEYS[4], cid)
end
return out
