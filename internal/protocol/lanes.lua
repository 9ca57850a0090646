-- lanes.lua: who goes first (bucket.WithLane; docs/lanes.md). A caller's
-- lane travels in its ID: "<id>#<weight>,<priority>,<lane>" (its Go twin
-- is lane.go); an ID without '#' is the default lane's, named '' here.
-- Needs tokens.lua and entry.lua before it.
--
-- The default lane's list is the queue of a bucket without lanes (its
-- key of old, lk.queue); a named lane's is lk.prefix .. name. A named
-- lane with callers is a member of the sorted set of its priority class,
-- lk.class .. priority, scored by its head's finish tag; lk.classes holds
-- the classes with named lanes (member the priority, score its negation,
-- so that the highest comes first). The default lane is of class 0 and
-- is found by its list alone, so that a bucket whose callers name no lane
-- runs exactly as before (and callers pushed without a script, or by a
-- process of the version before lanes, are never stranded).
--
-- Whom to serve: self-clocked fair queueing (Golestani, 1994) in the
-- cost units of the first policy, within a class: a lane's head carries
-- a finish tag, F = max(V, F_last) + cost / weight when the lane gets a
-- caller after having none (V the class's virtual time, F_last the lane's
-- last caller's finish), and F_prev + cost / weight when it follows a
-- caller of its lane; the lane with the smallest tag is served, and V
-- becomes its tag, so that a lane that comes later is tagged later. Ties
-- go by name. Between classes the higher one is served first, but each
-- class below one with callers is owed a floor: 1 cost unit of every
-- LANE_FLOOR + 1 served while it waits (counted per class, field
-- 'd<priority>', so that a class two below is owed its floor by the
-- class just above it). lk.tags, a hash, holds the fields 'v<p>' (V),
-- 'f<lane>' (F_last of a lane without callers; 'f' the default lane's),
-- 'h' (the default lane's head's tag) and 'd<p>'; it is deleted when no
-- named lane has callers, so that the tags start from 0 again.

local LANE_FLOOR = 15
-- LANE_TTL (ms) is how long a lane's keys outlive the last push or pop:
-- a lane waits behind others, so its list cannot expire with the
-- estimate of its tail, as the default lane's does without lanes.
local LANE_TTL = 3600000

-- lane_of returns the lane ('' for the default one), weight and
-- priority of caller entry or ID e.
local function lane_of(e)
  local w, p, name = string.match(e, '^[^#|]*#(%d+),(%d+),([^|]+)')
  if not w then return '', 1, 0 end
  return name, tonumber(w), tonumber(p)
end

-- lane_list is the key of lane name's list.
local function lane_list(lk, name)
  if name == '' then return lk.queue end
  return lk.prefix .. name
end

-- lanes_on says whether any named lane has callers (or its class is yet
-- to be found empty by a step).
local function lanes_on(lk)
  return redis.call('EXISTS', lk.classes) == 1
end

-- lane_count is how many lanes of class p have callers, the caller's own
-- (name) counted when it has none yet: a waiter's share of its class is
-- at most its weight over the lanes', and its estimate counts that share.
local function lane_count(lk, name, p, dlen)
  local n = redis.call('ZCARD', lk.class .. p)
  if p == 0 and (dlen > 0 or name == '') then n = n + 1 end
  if name ~= '' and not redis.call('ZSCORE', lk.class .. p, name) then n = n + 1 end
  return n
end

-- lane_cost is what caller entry e counts in its lane's share: its cost
-- of the first policy (Enter's when it has none of its own), or a
-- thousandth of Enter's when that is 0, so that every call counts.
local function lane_cost(e, ps)
  local _, _, costs = entry_parts(e)
  local c = costs and costs[1] or ps[1].call
  if c > 0 then return c end
  return (ps[1].call > 0 and ps[1].call or 1) / 1000
end

-- lane_join makes lane name of weight w and priority p, whose list was
-- empty, a lane with callers, its head entry e: tagged max(V, F_last) +
-- its cost / w.
local function lane_join(lk, name, w, p, e, ps)
  if name == '' then return end
  local t = redis.call('HMGET', lk.tags, 'v' .. p, 'f' .. name)
  local f = math.max(tonumber(t[1]) or 0, tonumber(t[2]) or 0) + lane_cost(e, ps) / w
  redis.call('ZADD', lk.class .. p, f, name)
  redis.call('ZADD', lk.classes, -p, p)
  redis.call('PEXPIRE', lk.class .. p, LANE_TTL)
  redis.call('PEXPIRE', lk.classes, LANE_TTL)
  redis.call('PEXPIRE', lk.tags, LANE_TTL)
end

-- lane_left takes lane name of priority p out of its class when its list
-- is empty (its last callers left the queue without being served).
local function lane_left(lk, name, p)
  if name == '' or redis.call('EXISTS', lk.prefix .. name) == 1 then return end
  redis.call('ZREM', lk.class .. p, name)
  if redis.call('EXISTS', lk.class .. p) == 0 then redis.call('ZREM', lk.classes, p) end
end

-- lane_classes returns the priorities of the classes with callers,
-- highest first: the named lanes' and 0 when the default lane has
-- callers (dlen its length).
local function lane_classes(lk, dlen)
  local out, zero = {}, false
  for _, c in ipairs(redis.call('ZRANGE', lk.classes, 0, -1)) do
    out[#out + 1] = tonumber(c)
    if out[#out] == 0 then zero = true end
  end
  if dlen > 0 and not zero then out[#out + 1] = 0 end
  return out
end

-- next_slot is the slot caller entry e would have next, no earlier than
-- last, with its costs (nil: each policy's call) and what it takes of
-- each policy (schedule.lua's pops and lanes_pop).
local function next_slot(st, ps, e, last, now)
  local _, _, costs = entry_parts(e)
  local ks = {}
  for k = 1, #ps do ks[k] = costs and costs[k] or ps[k].call end
  return math.max(last, slot_k(st, ps, now, ks)), costs, ks
end

-- give_slot gives caller entry e its slot (next_slot's, with its costs and
-- ks): its tokens taken at the slot, its grant logged in the windows, its
-- costs off the state's extras, and e, its slot and its anchors (take_at's)
-- added to ids, slots and anchors.
local function give_slot(st, ps, e, slot, costs, ks, now, ids, slots, anchors)
  ids[#ids + 1] = e
  slots[#ids] = slot
  anchors[#ids] = take_at(st, ps, slot, ks, now)
  window_record(st, ps, slot, ks)
  if costs then
    st.costed = st.costed - 1
    for j = 1, #ps do st[j].extra = st[j].extra - (costs[j] - ps[j].call) end
  end
end

-- lanes_pop is schedule.lua's pop when named lanes have callers: one
-- caller at a time, the next as the rules above choose, until batch
-- callers or a slot beyond the lookahead; each caller's slot follows from
-- the state its predecessors left (take_at), never before last. It fills
-- ids (entries), slots and anchors, takes the callers with costs off the
-- state's extras, and returns the slot of the caller it stopped at (nil:
-- none), how many callers remain queued (at least; 0: none) and the last
-- slot given.
local function lanes_pop(lk, st, ps, now, lookahead, batch, last, ids, slots, anchors)
  local dlen = redis.call('LLEN', lk.queue)
  local cls = lane_classes(lk, dlen)
  local tags, dirty = {}, {}
  local function tag(f)
    if tags[f] == nil then tags[f] = tonumber(redis.call('HGET', lk.tags, f)) or false end
    return tags[f] or nil
  end
  local function set(f, v) tags[f], dirty[f] = v, true end
  local kept = {} -- the lists popped that still have callers: their TTL renewed
  local unit = ps[1].call > 0 and ps[1].call or 1
  local owed = -LANE_FLOOR * unit -- a class's floor count when it starts waiting
  local dtwo -- the default lane's head and the one after it
  if dlen == 0 and tag('h') then
    set('f', tag('h')) -- its callers left: the head's tag is its last
    set('h', false)
  end
  local blocked
  while #ids < batch and #cls > 0 do
    -- The class: the highest, unless the floor of the one below is due.
    local i = 1
    while i < #cls and (tag('d' .. cls[i]) or owed) >= 0 do i = i + 1 end
    local p = cls[i]
    local top = redis.call('ZRANGE', lk.class .. p, 0, 0, 'WITHSCORES')
    local name, f = top[1], tonumber(top[2])
    local two
    if p == 0 and dlen > 0 then
      dtwo = dtwo or redis.call('LRANGE', lk.queue, 0, 1)
      if not dtwo[1] then dlen = 0 end -- expired
      if dtwo[1] and not tag('h') then
        set('h', math.max(tag('v0') or 0, tag('f') or 0) + lane_cost(dtwo[1], ps))
      end
      if dtwo[1] and (not name or tag('h') <= f) then name, f, two = '', tag('h'), dtwo end
    end
    if name and not two then two = redis.call('LRANGE', lane_list(lk, name), 0, 1) end
    local e = two and two[1]
    if not e then
      -- The class is empty, or the lane's list is (its callers left, or it
      -- expired): forget it.
      if name == '' then
        dlen = 0
      elseif name then
        redis.call('ZREM', lk.class .. p, name)
      end
      if redis.call('ZCARD', lk.class .. p) == 0 then
        redis.call('ZREM', lk.classes, p)
        if p ~= 0 or dlen == 0 then
          table.remove(cls, i)
          if #cls > 0 then set('d' .. cls[#cls], false) end
        end
      end
    else
      local slot, costs, ks = next_slot(st, ps, e, last, now)
      if slot - now > lookahead then
        blocked = slot
        break
      end
      local qk = lane_list(lk, name)
      redis.call('LPOP', qk)
      give_slot(st, ps, e, slot, costs, ks, now, ids, slots, anchors)
      last = slot
      -- Its lane's tags, and the classes' floors.
      local _, w = lane_of(e)
      set('v' .. p, f)
      if name == '' then
        dlen, dtwo = dlen - 1, nil
        if two[2] then
          set('h', f + lane_cost(two[2], ps))
        else
          set('f', f)
          set('h', false)
        end
      elseif two[2] then
        redis.call('ZADD', lk.class .. p, f + lane_cost(two[2], ps) / (select(2, lane_of(two[2])) or w), name)
        kept[qk] = true
      else
        redis.call('ZREM', lk.class .. p, name)
        set('f' .. name, f)
      end
      local c = lane_cost(e, ps)
      for j = 1, i - 1 do set('d' .. cls[j], (tag('d' .. cls[j]) or owed) - LANE_FLOOR * c) end
      if i < #cls then set('d' .. p, (tag('d' .. p) or owed) + c) end
    end
  end
  local on = lanes_on(lk)
  if not on then
    redis.call('DEL', lk.tags) -- the tags start from 0 again
  else
    local hset, hdel = {}, {}
    for f in pairs(dirty) do
      if tags[f] then
        hset[#hset + 1] = f
        hset[#hset + 1] = string.format('%.17g', tags[f])
      else
        hdel[#hdel + 1] = f
      end
    end
    if #hset > 0 then redis.call('HSET', lk.tags, unpack(hset)) end
    if #hdel > 0 then redis.call('HDEL', lk.tags, unpack(hdel)) end
    redis.call('PEXPIRE', lk.tags, LANE_TTL)
    redis.call('PEXPIRE', lk.classes, LANE_TTL)
    for _, c in ipairs(cls) do redis.call('PEXPIRE', lk.class .. c, LANE_TTL) end
    for qk in pairs(kept) do redis.call('PEXPIRE', qk, LANE_TTL) end
    if dlen > 0 then redis.call('PEXPIRE', lk.queue, LANE_TTL) end
  end
  return blocked, dlen + (on and 1 or 0), last
end
