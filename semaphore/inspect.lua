-- inspect.lua: one semaphore as every process sees it, for Inspect. It
-- only reads: expired leases are left for sync.lua to purge, and counted
-- apart. Redis TIME is the clock; times are integer microseconds.
--
-- KEYS[1] leases  ZSET   id -> lease expiry: every holder and every waiter
-- KEYS[2] queue   ZSET   waiter id -> ticket
-- KEYS[3] weights HASH   holder id -> weight, for weights above 1 only
-- KEYS[4] config  HASH   format, capacity (see stored.go)
--
-- No ARGV.
--
-- Reply: {now, format, capacity, holders, held, queued, head, expired}
--   now       Redis TIME (µs)
--   format    the stored format, false when no config is stored
--   capacity  the stored capacity, false when none is stored
--   holders   permits held by live leases, in every process
--   held      their weight
--   queued    waiters with live leases
--   head      the weight the first live waiter waits for, 0 when none
--   expired   leases (held or waiting) past their end that no call has
--             purged yet: a dead process's, freed by the next call
--
-- The work is O(log n) plus the expired leases and the holders above
-- weight 1: the figures come from ZCARD and the weights hash, less the
-- expired ones, as sync.lua counts the weight free.

local leases, queue, weights, config = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local function us(x) return string.format('%d', x) end

-- The weight an id stands for: as sync.lua's weight().
local function weight(id)
  local w = string.match(id, '^[^:]*:[^:]*:(%d+)$')
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

return {now, conf[1], conf[2], holders, held, nQueue - deadQueued, head, #dead}
