-- lanes.lua: who goes first among a semaphore's waiters (WithLane;
-- docs/lanes.md): the rules of the bucket's lanes
-- (internal/protocol/lanes.lua), counted in permits. sync.lua's body
-- follows this part and calls it.
--
-- A waiter's lane travels in its id: "<id>#<weight>,<priority>,<lane>"
-- (protocol.LaneID); an id without '#' is the default lane's, named ''
-- here. The default lane's waiters are the queue of a semaphore without
-- lanes (sync.lua's KEYS[2], leases in KEYS[1]). A named lane's waiters
-- are the sorted set lk.prefix .. name (member the id, score its ticket:
-- FIFO within the lane), and their queue leases are in lk.waits (member
-- the id, score the lease's end): a named lane's waiter enters KEYS[1]
-- only when granted, with the lease it had, so that the weight held is
-- counted as without lanes and a semaphore whose waiters name no lane
-- runs as it did before (its only extra call a ZCARD of lk.waits).
--
-- A named lane with waiters is a member of lk.class .. priority, scored
-- by its head's finish tag; lk.classes holds the classes with named
-- lanes (member the priority, score its negation: the highest first).
-- The default lane is of class 0 and is found by its queue alone.
--
-- Whom to serve: self-clocked fair queueing within a class, in permits (a
-- waiter of weight 3 counts 3): a lane's head carries a finish tag, F =
-- max(V, F_last) + its weight / the lane's weight when the lane gets a
-- waiter after having none (V the class's virtual time, F_last the tag of
-- the lane's last waiter served), and F_prev + weight / lane weight when
-- it follows a waiter of its lane; the lane with the smallest tag is
-- served (ties: the default lane, then by name), and V becomes its tag,
-- so that a lane that comes later is tagged later. Between classes the
-- higher first, but each class below one with waiters is owed a floor: 1
-- permit of every LANE_FLOOR + 1 granted while it waits (field
-- 'd<priority>' of lk.tags). The waiter chosen is granted when its weight
-- is free; until then nobody else is (no overtaking, as without lanes).
-- lk.tags holds 'v<p>' (V), 'f<lane>' (F_last of a lane without waiters;
-- 'f' the default lane's), 'h' (the default lane's head's tag) and
-- 'd<p>'; it is deleted when no named lane has waiters, so that the tags
-- start from 0 again.
--
local LANE_FLOOR = 15

-- lane_of returns the lane ('' for the default one), weight and priority
-- of waiter id.
local function lane_of(id)
  if not string.find(id, '#', 1, true) then return '', 1, 0 end -- plain: cheaper
  local w, p, name = string.match(id, '^[^#]*#(%d+),(%d+),(.+)$')
  if not w then return '', 1, 0 end
  return name, tonumber(w), tonumber(p)
end

-- lanes_waiting is how many waiters the named lanes of l (below) have.
local function lanes_waiting(l)
  return redis.call('ZCARD', l .. 'waits')
end

-- lanes_new returns lk, the lanes of a call, from l (the semaphore's Go
-- suffixLanes): its keys, the named lanes' sets (prefix .. lane), the
-- classes, the classes' sets (class .. priority), the tags and the named
-- lanes' leases (waits); the semaphore's leases and queue; the lanes'
-- keys' TTL (ms); the call's bookkeeping (touched: the lanes and classes
-- whose keys to expire; joined; len: the lane lengths read); and its
-- functions, called as methods (lk:add(...)). They are defined here, so
-- that a call that meets no named lane defines none of them: each
-- function defined costs Redis a little on every call.
local function lanes_new(l, leases, queue, ttl)
  local lk = {prefix = l .. ':', classes = l .. 's', class = l .. 's:', tags = l .. 'tags', waits = l .. 'waits',
    leases = leases, queue = queue, ttl = ttl, touched = {}, joined = {}, len = {}, later = {}, laterWaits = {}}

  -- lane_touch notes that lane name of class p was made or refreshed: its
  -- keys' TTLs are raised at the end of the call (lanes_end).
  local function lane_touch(lk, name, p)
    lk.touched['l' .. name] = lk.prefix .. name
    lk.touched['c' .. p] = lk.class .. p
  end

  -- lane_len is how many waiters lane name has (read once a call).
  local function lane_len(lk, name)
    local n = lk.len[name]
    if not n then
      n = redis.call('ZCARD', lk.prefix .. name)
      lk.len[name] = n
    end
    return n
  end

  -- lane_add queues waiter id of lane name and class p, of weight w, at
  -- ticket, its queue lease ending at lease (µs string), and makes the lane
  -- one with waiters if it was not (once a call): its head tagged max(V,
  -- F_last) + w / the lane's weight. With later, the waiter is written by
  -- lanes_flush (arrivals come in batches).
  local function lane_add(lk, id, name, p, w, ticket, lease, later)
    if later then
      local q = lk.later[name]
      if not q then
        q = {}
        lk.later[name] = q
      end
      q[#q + 1] = ticket
      q[#q + 1] = id
      lk.laterWaits[#lk.laterWaits + 1] = lease
      lk.laterWaits[#lk.laterWaits + 1] = id
    else
      redis.call('ZADD', lk.prefix .. name, ticket, id)
      redis.call('ZADD', lk.waits, lease, id)
    end
    if lk.len[name] then lk.len[name] = lk.len[name] + 1 end
    local key = p .. '|' .. name
    if lk.joined[key] then return end
    lk.joined[key] = true
    if redis.call('ZSCORE', lk.class .. p, name) then return end
    lane_touch(lk, name, p)
    local t = redis.call('HMGET', lk.tags, 'v' .. p, 'f' .. name)
    local _, lw = lane_of(id)
    redis.call('ZADD', lk.class .. p, math.max(tonumber(t[1]) or 0, tonumber(t[2]) or 0) + w / lw, name)
    if not lk.joined[p] then -- its class, once a call
      lk.joined[p] = true
      redis.call('ZADD', lk.classes, -p, p)
    end
  end

  -- lane_remove takes waiter id of lane name out of its lane (1 if it was
  -- there, else 0), and the lane out of its class if it has no waiters
  -- left: a lane that gets waiters again is tagged anew.
  local function lane_remove(lk, id, name)
    local n = redis.call('ZREM', lk.prefix .. name, id)
    redis.call('ZREM', lk.waits, id)
    if n == 1 and lk.len[name] then lk.len[name] = lk.len[name] - 1 end
    if n == 1 and redis.call('EXISTS', lk.prefix .. name) == 0 then
      local _, _, p = lane_of(id)
      redis.call('ZREM', lk.class .. p, name)
      if redis.call('EXISTS', lk.class .. p) == 0 then redis.call('ZREM', lk.classes, p) end
    end
    return n
  end

  -- lanes_flush writes the waiters lane_add kept for later.
  local function lanes_flush(lk)
    for name, q in pairs(lk.later) do
      for j = 1, #q, 1000 do redis.call('ZADD', lk.prefix .. name, unpack(q, j, math.min(j + 999, #q))) end
    end
    local ws = lk.laterWaits
    for j = 1, #ws, 1000 do redis.call('ZADD', lk.waits, unpack(ws, j, math.min(j + 999, #ws))) end
    lk.later, lk.laterWaits = {}, {}
  end

  -- lanes_purge takes the named lanes' waiters whose lease ended by now
  -- out of their lanes, and returns how many.
  local function lanes_purge(lk, now)
    local gone = redis.call('ZRANGEBYSCORE', lk.waits, '-inf', now)
    for _, id in ipairs(gone) do lane_remove(lk, id, lane_of(id)) end
    return #gone
  end

  -- lanes_lease moves the leases of the named lanes' waiters granted (ids)
  -- from lk.waits to lk.leases (a waiter without one gets a lease ending at
  -- wait, µs): a grant keeps its waiter lease, as in the default lane. It
  -- returns the latest end moved, 0 for none.
  local function lanes_lease(lk, ids, wait)
    local latest = 0
    for k = 1, #ids, 1000 do
      local part = {unpack(ids, k, math.min(k + 999, #ids))}
      local ends, moved = redis.call('ZMSCORE', lk.waits, unpack(part)), {}
      for n, id in ipairs(part) do
        local e = tonumber(ends[n]) or wait
        moved[#moved + 1] = string.format('%d', e)
        moved[#moved + 1] = id
        latest = math.max(latest, e)
      end
      redis.call('ZADD', lk.leases, unpack(moved))
      redis.call('ZREM', lk.waits, unpack(part))
    end
    return latest
  end

  -- lane_classes returns the priorities of the classes with waiters,
  -- highest first: the named lanes' and 0 when the default lane has
  -- waiters (dq of them).
  local function lane_classes(lk, dq)
    local out, zero = {}, false
    for _, c in ipairs(redis.call('ZRANGE', lk.classes, 0, -1)) do
      out[#out + 1] = tonumber(c)
      if out[#out] == 0 then zero = true end
    end
    if dq > 0 and not zero then out[#out + 1] = 0 end
    return out
  end

  -- lanes_grant is sync.lua's grant step while named lanes have waiters:
  -- one waiter at a time, the next as the rules above choose, while its
  -- weight fits in g.room. g: room, capacity, dq and nq (the default and
  -- named lanes' waiters, updated), weight (of an id), waitEnd (µs), and
  -- the callbacks grant(id, w, name) and refuse(id, name) (a weight above
  -- the capacity). The default lane's waiters stay in lk.queue, for the
  -- caller to remove; a named lane's leave it here, their leases moving to
  -- lk.leases (lanes_lease, whose latest end it returns).
  local function lanes_grant(lk, g)
    local moved = {} -- the named lanes' waiters granted
    local off = {} -- how many each lane's granted, still at its start: removed at the end
    local cls = lane_classes(lk, g.dq)
    local tags, dirty = {}, {}
    -- The tags it reads, in one call: the classes' and the default lane's.
    local want = {'h', 'f'}
    for _, c in ipairs(cls) do
      want[#want + 1] = 'v' .. c
      want[#want + 1] = 'd' .. c
    end
    for n, v in ipairs(redis.call('HMGET', lk.tags, unpack(want))) do tags[want[n]] = tonumber(v) or false end
    local function tag(f)
      if tags[f] == nil then tags[f] = tonumber(redis.call('HGET', lk.tags, f)) or false end
      return tags[f] or nil
    end
    local function set(f, v) tags[f], dirty[f] = v, true end
    local owed = -LANE_FLOOR -- a class's floor count when it starts waiting
    local dfrom, dtwo = 0, nil -- the default lane's waiters served (still in lk.queue); its head and the next
    if g.dq == 0 and tag('h') then
      set('f', tag('h')) -- its waiters left: the head's tag is its last
      set('h', false)
    end
    while g.room > 0 and #cls > 0 do
      -- The class: the highest, unless the floor of the one below is due.
      local i = 1
      while i < #cls and (tag('d' .. cls[i]) or owed) >= 0 do i = i + 1 end
      local p = cls[i]
      local top = redis.call('ZRANGE', lk.class .. p, 0, 0, 'WITHSCORES')
      local name, f = top[1], tonumber(top[2])
      local two
      if p == 0 and g.dq > 0 then
        dtwo = dtwo or redis.call('ZRANGE', lk.queue, dfrom, dfrom + 1)
        if not dtwo[1] then g.dq = 0 end -- expired
        if dtwo[1] and not tag('h') then
          set('h', math.max(tag('v0') or 0, tag('f') or 0) + g.weight(dtwo[1]))
        end
        if dtwo[1] and (not name or tag('h') <= f) then name, f, two = '', tag('h'), dtwo end
      end
      if name and not two then
        local o = off[name] or 0
        two = redis.call('ZRANGE', lk.prefix .. name, o, o + 1)
      end
      local id = two and two[1]
      local w = id and g.weight(id)
      if not id then
        -- The class is empty, or the lane is (expired): forget it.
        if name == '' then
          g.dq = 0
        elseif name then
          redis.call('ZREM', lk.class .. p, name)
        end
        if redis.call('ZCARD', lk.class .. p) == 0 then
          redis.call('ZREM', lk.classes, p)
          if p ~= 0 or g.dq == 0 then
            table.remove(cls, i)
            if #cls > 0 then set('d' .. cls[#cls], false) end
          end
        end
      elseif w > g.capacity then
        -- Heavier than the capacity (lowered while it waited): it leaves,
        -- and the next of its lane inherits its tag.
        if name == '' then
          dfrom, g.dq, dtwo = dfrom + 1, g.dq - 1, nil
        else
          lane_remove(lk, id, name)
          g.nq = g.nq - 1
        end
        g.refuse(id, name)
      elseif w > g.room then
        break -- it waits for its weight, and everyone else with it
      else
        g.grant(id, w, name)
        -- Its lane's tags, and the classes' floors.
        set('v' .. p, f)
        if name == '' then
          dfrom, g.dq, dtwo = dfrom + 1, g.dq - 1, nil
          if two[2] then
            set('h', f + g.weight(two[2]))
          else
            set('f', f)
            set('h', false)
          end
        else
          off[name] = (off[name] or 0) + 1
          moved[#moved + 1] = id
          g.nq = g.nq - 1
          if two[2] then
            redis.call('ZADD', lk.class .. p, f + g.weight(two[2]) / select(2, lane_of(two[2])), name)
          else
            redis.call('ZREM', lk.class .. p, name)
            set('f' .. name, f)
          end
        end
        for j = 1, i - 1 do set('d' .. cls[j], (tag('d' .. cls[j]) or owed) - LANE_FLOOR * w) end
        if i < #cls then set('d' .. p, (tag('d' .. p) or owed) + w) end
      end
    end
    for name, n in pairs(off) do redis.call('ZREMRANGEBYRANK', lk.prefix .. name, 0, n - 1) end
    local latest = lanes_lease(lk, moved, g.waitEnd)
    if g.nq == 0 then return latest end -- lanes_end deletes the tags
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
    return latest
  end

  -- lanes_end ends a call that saw named lanes with waiters (was) or wrote
  -- them: with none left (nq), the classes and the tags go (the tags start
  -- from 0 again); else it raises the TTL of the lanes' keys this call wrote
  -- to lk.ttl. A lane's waiters refresh their leases every third of a queue
  -- TTL, each time raising their lane's keys, so that the keys outlive
  -- every live waiter.
  local function lanes_end(lk, was, nq)
    if not was and next(lk.touched) == nil then return end
    if nq == 0 then
      for _, p in ipairs(redis.call('ZRANGE', lk.classes, 0, -1)) do
        redis.call('DEL', lk.class .. p)
      end
      redis.call('DEL', lk.classes, lk.tags)
      return
    end
    for _, key in pairs(lk.touched) do redis.call('PEXPIRE', key, lk.ttl) end
    redis.call('PEXPIRE', lk.waits, lk.ttl)
    redis.call('PEXPIRE', lk.classes, lk.ttl)
    redis.call('PEXPIRE', lk.tags, lk.ttl)
  end

  lk.touch, lk.len_of, lk.add, lk.remove, lk.flush = lane_touch, lane_len, lane_add, lane_remove, lanes_flush
  lk.purge, lk.grant, lk.finish = lanes_purge, lanes_grant, lanes_end
  return lk
end
