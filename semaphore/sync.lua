-- sync.lua: one exchange between a process and one semaphore. Every change a
-- process makes (release, leave the queue, renew, refresh, arrive) goes
-- through here, batched, so one round trip serves many callers. Redis TIME
-- is the only clock; all times are integer microseconds.
--
-- KEYS[1] leases  ZSET   member id, score lease expiry (µs): every holder
--                        and every waiter
-- KEYS[2] queue   ZSET   member waiter id, score ticket (arrival order);
--                        holders are the members of leases not in queue
-- KEYS[3] seq     STRING last ticket handed out
-- KEYS[4] weights HASH   member holder id, value its weight: the holders
--                        of weight above 1 only (absent for a workload of
--                        weight 1)
-- KEYS[5] config  HASH   format: the layout of these keys (ARGV[14]);
--                        capacity: the capacity in force (see stored.go)
-- KEYS[6] lanes   the start of the lanes' keys (lanes.lua), which it
--                        makes: L .. ':' .. lane, L .. 's', L .. 's:' ..
--                        priority, L .. 'tags', L .. 'waits'
--
-- ARGV[1]  capacity: the caller's (claim, set) or the last it knew (follow)
-- ARGV[2]  lease TTL of a permit (µs)
-- ARGV[3]  lease TTL of a waiter (µs)
-- ARGV[4]  max queue length of each lane, 0 for unlimited
-- ARGV[5]  wake channel prefix: grants to waiters of process P are published
--          on ARGV[5] .. P, payload the space-separated waiter ids
-- ARGV[6]  calling process id: its grants come back in the reply instead
-- ARGV[7]  1 if the caller has waiters (it wants the wait reply), else 0
-- ARGV[8]  number of permits to release
-- ARGV[9]  number of waiters leaving the queue
-- ARGV[10] number of permits to renew
-- ARGV[11] number of waiters to refresh
-- ARGV[12] number of waiters arriving
-- ARGV[13] mode: 'claim' runs only under ARGV[1] (a process whose
--          capacity was never accepted), 'follow' runs under the capacity
--          stored, 'set' stores ARGV[1] first (SetCapacity)
-- ARGV[14] the format this code writes (stored.go's storeFormat)
-- ARGV[15] how long the config outlives the last call that used it (ms)
-- ARGV[16] number of permits to register
-- ARGV[17...] the ids: releases, leaves, renewals, registrations,
--          refreshes, arrivals; a refreshed waiter takes two slots: id,
--          ticket
--
-- Registering a permit holds it from now, for a lease of ARGV[2], whatever
-- the room: a renewal that writes the lease anew if it is gone. A process
-- with Config.Fallback registers, when Redis answers again, every permit
-- it holds: those it granted from its local share while Redis was away,
-- and those it held through the outage (an empty restart lost them). The
-- weight held may then be above the capacity for a while, as after
-- SetCapacity lowered it: nobody is admitted until it is below. The reply
-- has no entry for them (each gets its lease).
--
-- Ids are "<process id>:<n>" for weight 1 and "<process id>:<n>:<weight>"
-- above, with no ':' or '#' in the process id, and end with
-- "#<weight>,<priority>,<lane>" in a named lane (lanes.lua): a waiter's
-- weight and lane travel in its id, so any process can grant it and a
-- requeued waiter keeps them. The weight
-- held is (holders) + the sum over KEYS[4] of (weight - 1), so a workload of
-- weight 1 reads one empty hash and writes nothing more.
--
-- Config: when none is stored (a new semaphore, one idle for longer than
-- ARGV[15], or state written before the config was stored: it is migrated
-- here), ARGV[1] is stored. A stored format other than ARGV[14] is refused
-- before anything is written: {'format', stored format}. In mode 'claim'
-- a stored capacity other than ARGV[1] is refused the same way:
-- {'mismatch', stored capacity}.
--
-- Reply, one flat array (one table to build and convert):
--   {capacity, wait, released..., left..., renewed..., refreshed...,
--    acquired..., granted...}
-- where the lists have the lengths the caller sent (acquired one per
-- arrival) and granted runs to the end:
--   capacity     the capacity in force
--   wait         µs until the first lease expires, when someone waits (the
--                head's weight is not free) and ARGV[7] is 1; else -1
--   released[i]  1 freed, 0 was not held (already released or expired)
--   left[i]      1 left the queue, 2 had been granted and is now released,
--                0 unknown
--   renewed[i]   lease µs remaining (the full TTL), 0 lost
--   refreshed[i] -1 was missing and is queued again with its ticket,
--                0 still waiting, >0 granted: lease µs remaining (renewed),
--                -2 refused: its weight is above the capacity in force
--   acquired[i]  0 granted at once (a lease of ARGV[2]) | >0 its ticket
--                (queued) | -1 queue full | -2 weight above the capacity
--   granted      pairs: waiter id, lease µs remaining, for the calling
--                process's waiters granted by this exchange; -1 for one
--                refused (its weight is above a lowered capacity). Other
--                processes hear of those in their wake message as '!' .. id
--
-- Each redis.call and each table costs (about 0.4 µs and more on a small
-- VM, where a whole call of this script was 30-40 µs), so the script makes
-- few: batches of releases and grants read their scores with one ZMSCORE,
-- and key TTLs are only ever raised, checked with one PTTL.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
-- %.14g would corrupt µs epochs: always format times with %d.
local function us(x) return string.format('%d', x) end

local capacity = tonumber(ARGV[1])
local mode, format, keepConfig = ARGV[13], ARGV[14], ARGV[15]
local leaseTTL = tonumber(ARGV[2])
local queueTTL = tonumber(ARGV[3])
local maxQueue = tonumber(ARGV[4])
local chanPrefix, self, wantWait = ARGV[5], ARGV[6], ARGV[7] == '1'
local nRelease, nLeave, nRenew = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local nRefresh, nAcquire = tonumber(ARGV[11]), tonumber(ARGV[12])
local nRegister = tonumber(ARGV[16])

local leases, queue, seq, weights, config = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
-- The lanes' keys (lanes.lua), made by the first use in a call that meets
-- a named lane: a call that meets none makes and defines nothing more.
local lk
local function lanes()
  lk = lk or lanes_new(KEYS[6], leases, queue, math.max(3600000, math.floor(3 * queueTTL / 1000)))
  return lk
end
local leaseEndN, waitEndN = now + leaseTTL, now + queueTTL
local leaseEnd, waitEnd = us(leaseEndN), us(waitEndN)
-- The latest lease end this call wrote (0: none): key TTLs must cover it.
local latest = 0

-- ZREM (or HDEL) in chunks: unpack of a long list would overflow the Lua C
-- stack.
local function zrem(key, ids, cmd)
  for i = 1, #ids, 1000 do
    redis.call(cmd or 'ZREM', key, unpack(ids, i, math.min(i + 999, #ids)))
  end
end

-- ZADD in chunks: pairs is score, member, score, member...
local function zadd(key, pairs)
  for j = 1, #pairs, 1000 do
    redis.call('ZADD', key, unpack(pairs, j, math.min(j + 999, #pairs)))
  end
end

-- ZMSCORE in chunks: the scores of ids in key, false where missing.
local function zmscore(key, ids)
  local out = {}
  for i = 1, #ids, 1000 do
    local part = redis.call('ZMSCORE', key, unpack(ids, i, math.min(i + 999, #ids)))
    for j = 1, #part do out[#out + 1] = part[j] end
  end
  return out
end

-- The weight an id stands for (see the header).
local function weight(id)
  -- Plain finds: half the cost of a pattern, and ids come by the thousand.
  local a = string.find(id, ':', 1, true)
  local b = a and string.find(id, ':', a + 1, true)
  if not b then return 1 end
  -- A lane's name may hold ':': the weight is before its '#'.
  local h = string.find(id, '#', a + 1, true)
  if h and h < b then return 1 end
  return tonumber(string.sub(id, b + 1, (h or 0) - 1)) or 1
end

-- The capacity in force, before anything is written: a refusal leaves no
-- trace.
local conf = redis.call('HMGET', config, 'format', 'capacity')
local storeConfig, lowered = true, false
if conf[1] then
  if conf[1] ~= format then
    return {'format', conf[1]}
  end
  local stored = tonumber(conf[2])
  if not stored or stored < 1 then
    return {'format', conf[1] .. ' with capacity ' .. tostring(conf[2])}
  end
  if mode == 'claim' and stored ~= capacity then
    return {'mismatch', stored}
  end
  if mode ~= 'set' then
    capacity = stored
  end
  lowered = capacity < stored
  storeConfig = stored ~= capacity
end
if storeConfig then
  redis.call('HSET', config, 'format', format, 'capacity', capacity)
  redis.call('PEXPIRE', config, keepConfig)
end

-- Expired leases go first, so nothing below can see or revive them; a dead
-- holder's weight goes with its lease.
local dead = redis.call('ZRANGEBYSCORE', leases, '-inf', us(now))
if #dead > 0 then
  zrem(leases, dead)
  zrem(queue, dead)
  local heavyDead = {}
  for _, id in ipairs(dead) do
    if weight(id) > 1 then heavyDead[#heavyDead + 1] = id end
  end
  zrem(weights, heavyDead, 'HDEL')
end
-- The named lanes' waiters (lanes.lua): nq of them, once the expired go.
local nq = lanes_waiting(KEYS[6])
local lanesWere = nq > 0
if nq > 0 then
  nq = nq - lanes():purge(us(now))
end

local i = 17
local released, left, renewed, refreshed = {}, {}, {}, {}

if nRelease == 1 then
  local id = ARGV[i]
  released[1] = redis.call('ZREM', leases, id)
  if released[1] == 1 and weight(id) > 1 then
    redis.call('HDEL', weights, id)
  end
elseif nRelease > 1 then
  -- One ZMSCORE tells which are held, one ZREM frees them all.
  local ids = {}
  for n = 1, nRelease do ids[n] = ARGV[i + n - 1] end
  local scores = zmscore(leases, ids)
  local heavyGone = {}
  for n, id in ipairs(ids) do
    if scores[n] then
      released[n] = 1
      if weight(id) > 1 then heavyGone[#heavyGone + 1] = id end
    else
      released[n] = 0
    end
  end
  zrem(leases, ids)
  zrem(weights, heavyGone, 'HDEL')
end
i = i + nRelease

for n = 1, nLeave do
  local id = ARGV[i]
  i = i + 1
  local name = lane_of(id)
  if name ~= '' and lanes():remove(id, name) == 1 then
    nq = nq - 1
    left[n] = 1
  elseif name == '' and redis.call('ZREM', queue, id) == 1 then
    redis.call('ZREM', leases, id)
    left[n] = 1
  elseif redis.call('ZREM', leases, id) == 1 then
    if weight(id) > 1 then redis.call('HDEL', weights, id) end
    left[n] = 2
  else
    left[n] = 0
  end
end

for n = 1, nRenew do
  -- XX: a lease that is gone stays gone.
  if redis.call('ZADD', leases, 'XX', 'CH', leaseEnd, ARGV[i]) == 1 then
    renewed[n] = leaseTTL
    if latest < leaseEndN then latest = leaseEndN end
  else
    renewed[n] = 0
  end
  i = i + 1
end

-- Registrations (see the header): their weight counts in the room below.
local registeredHeavy = false
for n = 1, nRegister do
  local id = ARGV[i]
  i = i + 1
  redis.call('ZADD', leases, leaseEnd, id)
  local w = weight(id)
  if w > 1 then
    redis.call('HSET', weights, id, w)
    registeredHeavy = true
  end
  if latest < leaseEndN then latest = leaseEndN end
end

local requeued = false
for n = 1, nRefresh do
  local id, ticket = ARGV[i], tonumber(ARGV[i + 1])
  i = i + 2
  local tooHeavy = weight(id) > capacity
  local name, _, p = lane_of(id)
  if redis.call('ZSCORE', name == '' and queue or lanes().prefix .. name, id) then
    if tooHeavy then
      -- The capacity was lowered below its weight: it can never be granted.
      if name == '' then
        redis.call('ZREM', queue, id)
        redis.call('ZREM', leases, id)
      else
        lanes():remove(id, name)
        nq = nq - 1
      end
      refreshed[n] = -2
    else
      if name == '' then
        redis.call('ZADD', leases, 'XX', waitEnd, id)
      else
        redis.call('ZADD', lanes().waits, waitEnd, id)
        lanes():touch(name, p)
      end
      if latest < waitEndN then latest = waitEndN end
      refreshed[n] = 0
    end
  elseif redis.call('ZADD', leases, 'XX', 'CH', leaseEnd, id) == 1 then
    -- Granted while we were not listening: the owner is alive, so the
    -- short grant becomes a full lease.
    refreshed[n] = leaseTTL
    if latest < leaseEndN then latest = leaseEndN end
  elseif tooHeavy then
    refreshed[n] = -2
  else
    -- Purged as expired although its process is alive (it stalled), or
    -- lost to a restart: back in line at its own ticket.
    if name == '' then
      redis.call('ZADD', queue, us(ticket), id)
      redis.call('ZADD', leases, waitEnd, id)
    else
      lanes():add(id, name, p, weight(id), us(ticket), waitEnd)
      nq = nq + 1
    end
    requeued = true
    if latest < waitEndN then latest = waitEndN end
    local last = tonumber(redis.call('GET', seq) or '0')
    if last < ticket then
      redis.call('SET', seq, us(ticket))
    end
    refreshed[n] = -1
  end
end

-- The weight free: capacity less every holder's weight.
local queued = redis.call('ZCARD', queue)
local heavy = redis.call('HVALS', weights)
local room = capacity - (redis.call('ZCARD', leases) - queued)
for _, w in ipairs(heavy) do
  room = room - (tonumber(w) - 1)
end
-- Holders of weight above 1 granted by this call, for KEYS[4]: id, weight.
local newHeavy = {}
local function hold(id, w)
  room = room - w
  if w > 1 then
    newHeavy[#newHeavy + 1] = id
    newHeavy[#newHeavy + 1] = w
  end
end

-- Hand free places to the head of the queue, in order while the head's
-- weight is free: a head that does not fit holds back everyone behind it.
-- A head heavier than the capacity itself (lowered while it waited) can
-- never fit: it leaves the queue, refused. A grant keeps the waiter's own
-- lease expiry, so a waiter whose process died blocks its place for at
-- most one waiter lease; a live one turns it into a full lease at its next
-- refresh or renewal.
local granted, wakes, served = {}, {}, {}
local function tell(id, msg, us)
  local proc = string.match(id, '^([^:]*):')
  if proc == self then
    granted[#granted + 1] = id
    granted[#granted + 1] = us
  elseif proc then
    local ids = wakes[proc]
    if ids then ids[#ids + 1] = msg else wakes[proc] = {msg} end
  end
end
local function refuse(id)
  served[#served + 1] = id
  redis.call('ZREM', leases, id)
  tell(id, '!' .. id, -1)
end
if lowered and queued + nq > 0 then
  -- SetCapacity lowered it: every waiter heavier than that leaves now.
  for _, id in ipairs(redis.call('ZRANGE', queue, 0, -1)) do
    if weight(id) > capacity then refuse(id) end
  end
  zrem(queue, served)
  queued = queued - #served
  served = {}
  for _, id in ipairs(nq > 0 and redis.call('ZRANGE', lanes().waits, 0, -1) or {}) do
    if weight(id) > capacity then
      lanes():remove(id, lane_of(id))
      nq = nq - 1
      tell(id, '!' .. id, -1)
    end
  end
end
if room > 0 and queued + nq > 0 then
  local from, blocked, grants = 0, false, {}
  if nq > 0 then
    -- Named lanes have waiters: whom to serve is lanes.lua's choice.
    local g = {room = room, capacity = capacity, dq = queued, nq = nq, weight = weight, waitEnd = waitEndN}
    g.grant = function(id, w, name)
      hold(id, w)
      g.room = room
      if name == '' then served[#served + 1] = id end
      grants[#grants + 1] = id
    end
    g.refuse = function(id, name)
      if name == '' then refuse(id) else tell(id, '!' .. id, -1) end
    end
    latest = math.max(latest, lanes():grant(g))
    nq, blocked = g.nq, true
  end
  while room > 0 and not blocked do
    -- Each weighs at least 1: the next room waiters are enough to look at.
    local heads = redis.call('ZRANGE', queue, from, from + room - 1)
    if #heads == 0 then break end
    from = from + #heads
    for _, id in ipairs(heads) do
      local w = weight(id)
      if w > capacity then
        refuse(id)
      elseif w > room then
        blocked = true
        break
      else
        hold(id, w)
        served[#served + 1] = id
        grants[#grants + 1] = id
      end
    end
  end
  -- Each grant keeps its waiter lease: one ZMSCORE reads them all.
  local ends = zmscore(leases, grants)
  for n, id in ipairs(grants) do
    tell(id, id, tonumber(ends[n]) - now)
  end
  zrem(queue, served)
  queued = queued - #served
  if queued + nq == 0 then
    redis.call('DEL', seq)
  end
end
for proc, ids in pairs(wakes) do
  redis.call('PUBLISH', chanPrefix .. proc, table.concat(ids, ' '))
end

-- Arrivals: served at once only if nobody is ahead of them and their weight
-- is free. Written with one ZADD per key rather than one per arrival: bursts
-- come in batches.
-- The reply so far (see the header); wait is filled in at the end, and the
-- arrivals' answers go straight in, as they can come by the thousand.
local out = {capacity, -1}
for _, list in ipairs({released, left, renewed, refreshed}) do
  for n = 1, #list do out[#out + 1] = list[n] end
end
local now_leases, new_queue, new_waits = {}, {}, {}
local firstTicket, tickets = nil, 0
-- 0: a queued arrival creates the queue key (dqBefore: the default
-- lane's), and seq (queuedBefore)
local queuedBefore, dqBefore = queued + nq, queued
for n = 1, nAcquire do
  local id = ARGV[i]
  local w = weight(id)
  i = i + 1
  local atOnce = queued + nq == 0 and room >= w
  local name, _, p -- its lane, read only when it queues
  if w <= capacity and not atOnce then name, _, p = lane_of(id) end
  if w > capacity then
    out[#out + 1] = -2
  elseif atOnce then
    now_leases[#now_leases + 1] = leaseEnd
    now_leases[#now_leases + 1] = id
    hold(id, w)
    if latest < leaseEndN then latest = leaseEndN end
    out[#out + 1] = 0
  elseif maxQueue > 0 and (name == '' and queued or lanes():len_of(name)) >= maxQueue then
    out[#out + 1] = -1
  else
    if not firstTicket then
      -- Tickets for every remaining arrival at most; unused ones are gaps.
      firstTicket = redis.call('INCRBY', seq, nAcquire - n + 1) - (nAcquire - n)
    end
    local ticket = firstTicket + tickets
    tickets = tickets + 1
    if name == '' then
      new_queue[#new_queue + 1] = ticket
      new_queue[#new_queue + 1] = id
      new_waits[#new_waits + 1] = waitEnd
      new_waits[#new_waits + 1] = id
      queued = queued + 1
    else
      lanes():add(id, name, p, w, ticket, waitEnd, true)
      nq = nq + 1
    end
    if latest < waitEndN then latest = waitEndN end
    out[#out + 1] = ticket
  end
end
zadd(leases, now_leases)
zadd(queue, new_queue)
if lk then lk:flush() end
zadd(leases, new_waits)
for j = 1, #newHeavy, 1000 do
  redis.call('HSET', weights, unpack(newHeavy, j, math.min(j + 999, #newHeavy)))
end

-- Every key outlives the last lease in it by at least a second. A call that
-- wrote a lease ending later than the keys' TTL covers raises the TTL of
-- every key (by a second more than it needs, so the calls that follow need
-- not); a call that created a key (the queue or seq, or weights) gives it
-- the TTL the others have. TTLs are only ever raised, never lowered, and
-- come from the leases written, not from one caller's Config alone, so a
-- process with shorter TTLs cannot expire the keys under another's live
-- lease; calls that only remove leases leave them alone. weights follows
-- leases whenever it exists, so a holder's weight lasts as long as its
-- lease. Empty sets and hashes vanish by themselves; an idle semaphore
-- leaves nothing behind.
if latest > 0 or #newHeavy > 0 then
  local have = redis.call('PTTL', leases) -- -1: no TTL yet (just created)
  local ttl = have
  local need = math.ceil((latest - now) / 1000) + 1000 -- latest's end + 1 s
  if latest > 0 and have < need then
    ttl = need + 1000
    redis.call('PEXPIRE', leases, ttl)
    if queued > 0 then
      redis.call('PEXPIRE', queue, ttl)
    end
    if queued + nq > 0 then
      redis.call('PEXPIRE', seq, ttl)
    end
    if #heavy > 0 or #newHeavy > 0 then
      redis.call('PEXPIRE', weights, ttl)
    end
  elseif ttl > 0 then
    if requeued or (firstTicket and (firstTicket == 1 or queuedBefore == 0)) or (dqBefore == 0 and #new_queue > 0) then
      redis.call('PEXPIRE', queue, ttl)
      redis.call('PEXPIRE', seq, ttl)
    end
    if (#heavy == 0 and #newHeavy > 0) or registeredHeavy then
      redis.call('PEXPIRE', weights, ttl)
    end
  end
  -- The config's week is counted from the last beat (a renewal or a
  -- refresh) rather than from every arrival: one call less per grant.
  if not storeConfig and nRenew + nRefresh + nRegister > 0 then
    redis.call('PEXPIRE', config, math.max(ttl, tonumber(keepConfig)))
  end
end

if queued + nq == 0 and (nLeave > 0 or #dead > 0 or lowered) then
  redis.call('DEL', seq)
end
if lk then lk:finish(lanesWere, nq) end

local wait = -1
if wantWait and queued + nq > 0 then
  local first = redis.call('ZRANGE', leases, 0, 0, 'WITHSCORES')
  if first[2] then wait = tonumber(first[2]) - now end
end

out[2] = wait
for n = 1, #granted do out[#out + 1] = granted[n] end
return out
