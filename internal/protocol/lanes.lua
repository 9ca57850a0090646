-- lanes.lua: who goes first (bucket.WithLane; docs/lanes.md). A caller's
-- lane travels in its ID: "<id>#<weight>,<priority>,<lane>" (its Go twin
-- is lane.go); an ID without '#' is the default lane's, named '' here.
-- Needs tokens.lua and entry.lua before it.
--
-- The default lane's list is the queue of a bucket without lanes (its
-- key of old, lk.queue); a named lane's is lk.prefix .. name. A named
-- lane with callers is a member of the sorted set of its priority class,
-- lk.class .. priority, scored by its head's start tag; lk.classes holds
-- the classes with named lanes (member the priority, score its negation,
-- so that the highest comes first). The default lane is of class 0 and
-- is found by its list alone, so that a bucket whose callers name no lane
-- runs exactly as before (and callers pushed without a script, or by a
-- process of the version before lanes, are never stranded).
--
-- Whom to serve: start-time fair queueing (Goyal et al., 1996) in the
-- cost units of the first policy, within a class: a lane's head starts at
-- S = max(V, F) (V the class's virtual time, the start tag of the last
-- caller served in it; F the lane's last finish tag), the lane with the
-- smallest S is served, and then F = S + cost / weight, V = S. Between
-- classes the higher one is served first, but each class below one with
-- callers is owed a floor: 1 cost unit of every LANE_FLOOR + 1 served
-- while it waits (counted per class, field 'd<priority>', so that a
-- class two below is owed its floor by the class just above it).
-- lk.tags, a hash, holds the fields 'v<p>' (V), 'f<lane>' (F of a lane
-- without callers; 'f' the default lane's) and 'd<p>'; it is deleted
-- when no lane has callers, so that the tags start from 0 again.

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

-- lane_join makes lane name of priority p, whose list was empty, a lane
-- with callers: its head starts at max(V, F).
local function lane_join(lk, name, p)
  if name == '' then return end
  local t = redis.call('HMGET', lk.tags, 'v' .. p, 'f' .. name)
  local s = math.max(tonumber(t[1]) or 0, tonumber(t[2]) or 0)
  redis.call('ZADD', lk.class .. p, s, name)
  redis.call('ZADD', lk.classes, -p, p)
  redis.call('PEXPIRE', lk.class .. p, LANE_TTL)
  redis.call('PEXPIRE', lk.classes, LANE_TTL)
  redis.call('PEXPIRE', lk.tags, LANE_TTL)
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

-- lanes_pop is schedule.lua's pop when named lanes have callers: one
-- caller at a time, the next as the rules above choose, until batch
-- callers or a slot beyond the lookahead; each caller's slot follows from
-- the state its predecessors left (take_at), never before last. It fills
-- ids (entries), slots and anchors, takes the callers with costs off the
-- state's extras, and returns the slot of the caller it stopped at (nil:
-- none) and how many callers remain queued (at least; 0: none).
local function lanes_pop(lk, st, ps, now, lookahead, batch, last, ids, slots, anchors)
  local dlen = redis.call('LLEN', lk.queue)
  local cls = lane_classes(lk, dlen)
  local tags, dirty = {}, {}
  local kept = {} -- the lists popped that still have callers: their TTL renewed
  local function tag(f)
    if tags[f] == nil then tags[f] = tonumber(redis.call('HGET', lk.tags, f)) or false end
    return tags[f] or nil
  end
  local function set(f, v) tags[f], dirty[f] = v, true end
  local unit = ps[1].call > 0 and ps[1].call or 1
  local owed = -LANE_FLOOR * unit -- a class's floor count when it starts waiting
  local blocked
  while #ids < batch and #cls > 0 do
    -- The class: the highest, unless the floor of the one below is due.
    local i = 1
    while i < #cls and (tag('d' .. cls[i]) or owed) >= 0 do i = i + 1 end
    local p = cls[i]
    local top = redis.call('ZRANGE', lk.class .. p, 0, 0, 'WITHSCORES')
    local name, s = top[1], tonumber(top[2])
    local v = tag('v' .. p) or 0
    if p == 0 and dlen > 0 then
      local sd = math.max(v, tag('f') or 0)
      if not name or sd <= s then name, s = '', sd end
    end
    -- The lane's head and whether another follows it, in one command.
    local two = name and redis.call('LRANGE', lane_list(lk, name), 0, 1) or {}
    local e = two[1]
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
      local _, _, costs = entry_parts(e)
      local ks = {}
      for k = 1, #ps do ks[k] = costs and costs[k] or ps[k].call end
      local slot = math.max(last, slot_k(st, ps, now, ks))
      if slot - now > lookahead then
        blocked = slot
        break
      end
      local qk = lane_list(lk, name)
      redis.call('LPOP', qk)
      ids[#ids + 1] = e
      slots[#ids], last = slot, slot
      anchors[#ids] = take_at(st, ps, slot, ks, now)
      window_record(st, ps, slot, ks)
      if costs then
        st.costed = st.costed - 1
        for j = 1, #ps do st[j].extra = st[j].extra - (costs[j] - ps[j].call) end
      end
      -- Its lane's tags, and the classes' floors.
      local _, w = lane_of(e)
      local c = ks[1] > 0 and ks[1] or unit / 1000
      s = math.max(s, v)
      local f = s + c / w
      set('v' .. p, s)
      if name == '' then
        dlen = dlen - 1
        set('f', f)
      elseif two[2] then
        redis.call('ZADD', lk.class .. p, f, name)
        kept[qk] = true
      else
        redis.call('ZREM', lk.class .. p, name)
        set('f' .. name, f)
      end
      for j = 1, i - 1 do set('d' .. cls[j], (tag('d' .. cls[j]) or owed) - LANE_FLOOR * c) end
      if i < #cls then set('d' .. p, (tag('d' .. p) or owed) + c) end
    end
  end
  local left = dlen + (lanes_on(lk) and 1 or 0)
  if left == 0 then
    redis.call('DEL', lk.tags)
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
  return blocked, left, last
end
