-- inspect.lua: one semaphore as every process sees it, for Inspect. It
-- only reads: expired leases are left for sync.lua to purge, and counted
-- apart. Redis TIME is the clock; times are integer microseconds.
--
-- KEYS[1] leases  ZSET   id -> lease expiry: every holder and every waiter
-- KEYS[2] queue   ZSET   waiter id -> ticket
-- KEYS[3] weights HASH   holder id -> weight, for weights above 1 only
-- KEYS[4] config  HASH   format, capacity (see stored.go)
-- KEYS[5] lanes           the start of the lanes' keys (sync.lua's KEYS[6])
--
-- No ARGV.
--
-- Reply: {now, format, capacity, holders, held, queued, head, expired}
--   now       Redis TIME (µs)
--   format    the stored format, false when no config is stored
--   capacity  the stored capacity, false when none is stored
--   holders   permits held by live leases, in every process
--   held      their weight
--   queued    waiters with live leases, in every lane
--   head      the weight the first live waiter waits for, 0 when none:
--             with named lanes, the head of the lane first by priority
--             and finish tag (lanes.lua's choice, the floor aside)
--   expired   leases (held or waiting) past their end that no call has
--             purged yet: a dead process's, freed by the next call
--
-- The work is O(log n) plus the expired leases and the holders above
-- weight 1: the figures come from ZCARD and the weights hash, less the
-- expired ones, as sync.lua counts the weight free; with named lanes,
-- plus the classes and the lanes found empty before the head.

local leases, queue, weights, config = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local l = KEYS[5]
local lanePrefix, classes, class, tags, waits = l .. ':', l .. 's', l .. 's:', l .. 'tags', l .. 'waits'
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function us(x) return string.format('%d', x) end

-- The weight an id stands for: as sync.lua's weight().
local function weight(id)
  local w = string.match(id, '^[^:]*:[^:#]*:(%d+)$') or string.match(id, '^[^:]*:[^:#]*:(%d+)#')
  if w then return tonumber(w) end
  return 1
end

local conf = redis.call('HMGET', config, 'format', 'capacity')
local nLeases = redis.call('ZCARD', leases)
local nQueue = redis.call('ZCARD', queue)

-- sync.lua's purge takes scores up to now, inclusive.
local dead = redis.call('ZRANGEBYSCORE', leases, '-inf', us(now))
local deadQueued, deadHolders, deadExtra = 0, 0, 0
for _, id in ipairs(dead) do
  if redis.call('ZSCORE', queue, id) then
    deadQueued = deadQueued + 1
  else
    deadHolders = deadHolders + 1
    deadExtra = deadExtra + weight(id) - 1
  end
end

local holders = nLeases - nQueue - deadHolders
local held = holders - deadExtra
for _, w in ipairs(redis.call('HVALS', weights)) do
  held = held + tonumber(w) - 1
end

-- The head: the first waiter whose lease is live; at most deadQueued
-- expired ones come before it.
local head = 0
for _, id in ipairs(redis.call('ZRANGE', queue, 0, deadQueued)) do
  local score = redis.call('ZSCORE', leases, id)
  if score and tonumber(score) > now then
    head = weight(id)
    break
  end
end

-- The named lanes' waiters, and their head when it comes before the
-- default lane's: the first lane with a live head of the highest class
-- (class 0 holds the default lane too).
local nWaits = redis.call('ZCARD', waits)
local named = 0
if nWaits > 0 then
  named = nWaits - redis.call('ZCOUNT', waits, '-inf', us(now))
end
local function live(id)
  local score = redis.call('ZSCORE', waits, id)
  return score and tonumber(score) > now
end
local function lanesHead()
  for _, p in ipairs(redis.call('ZRANGE', classes, 0, -1)) do
    for _, l in ipairs(redis.call('ZRANGE', class .. p, 0, -1)) do
      local id = redis.call('ZRANGE', lanePrefix .. l, 0, 0)[1]
      if id and live(id) then return p, l, id end
    end
  end
end
if named > 0 then
  local p, l, id = lanesHead()
  if id and (head == 0 or tonumber(p) > 0) then
    head = weight(id)
  elseif id then
    -- Class 0: the default lane's head is tagged 'h', or will be
    -- max(V, F_last) + its weight (lanes.lua); ties go to it.
    local t = redis.call('HMGET', tags, 'h', 'v0', 'f')
    local h = tonumber(t[1]) or math.max(tonumber(t[2]) or 0, tonumber(t[3]) or 0) + head
    if tonumber(redis.call('ZSCORE', class .. p, l)) < h then head = weight(id) end
  end
end

return {now, conf[1], conf[2], holders, held, nQueue - deadQueued + named, head, #dead}
