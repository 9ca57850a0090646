-- sync.lua: one exchange between a process and one semaphore. Every change a
-- process makes (release, leave the queue, renew, refresh, acquire) goes
-- through here, batched, so one round trip serves many callers. Redis TIME is
-- the only clock; all times are integer microseconds.
--
-- KEYS[1] holders  ZSET  member permit id, score lease expiry (µs)
-- KEYS[2] queue    ZSET  member waiter id, score ticket (arrival order)
-- KEYS[3] waiting  ZSET  member waiter id, score waiter lease expiry (µs)
-- KEYS[4] seq      STRING last ticket handed out
--
-- ARGV[1]  capacity
-- ARGV[2]  lease TTL of a permit (µs)
-- ARGV[3]  lease TTL of a waiter (µs)
-- ARGV[4]  max queue length, 0 for unlimited
-- ARGV[5]  wake channel prefix: grants to waiters of process P are published
--          on ARGV[5] .. P, payload the space-separated waiter ids
-- ARGV[6]  calling process id: its grants come back in the reply instead
-- ARGV[7]  number of permits to release
-- ARGV[8]  number of waiters leaving the queue
-- ARGV[9]  number of permits to renew
-- ARGV[10] number of waiters to refresh
-- ARGV[11] number of waiters arriving
-- ARGV[12...] the ids, in that order; a refreshed waiter takes two slots:
--          id, ticket
--
-- Ids are "<process id>:<n>" with no ':' in the process id.
--
-- Reply: {released, left, renewed, refreshed, acquired, granted, wait}
--   released[i]  1 freed, 0 was not held (already released or expired)
--   left[i]      1 left the queue, 2 had been granted and is now released,
--                0 unknown
--   renewed[i]   lease µs remaining (the full TTL), 0 lost
--   refreshed[i] -1 was missing and is queued again with its ticket,
--                0 still waiting, >0 granted: lease µs remaining (renewed)
--   acquired     pairs: 1, lease µs (granted at once) | 0, ticket (queued)
--                | -1, 0 (queue full)
--   granted      pairs: waiter id, lease µs remaining, for the calling
--                process's waiters granted by this exchange
--   wait         µs until the first held lease expires, when the semaphore
--                is full and someone waits; else -1

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
-- %.14g would corrupt µs epochs: always format times with %d.
local function us(x) return string.format('%d', x) end
local nowS = us(now)

local capacity = tonumber(ARGV[1])
local leaseTTL = tonumber(ARGV[2])
local queueTTL = tonumber(ARGV[3])
local maxQueue = tonumber(ARGV[4])
local chanPrefix = ARGV[5]
local self = ARGV[6]
local nRelease, nLeave, nRenew = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local nRefresh, nAcquire = tonumber(ARGV[10]), tonumber(ARGV[11])

local holders, queue, waiting, seq = KEYS[1], KEYS[2], KEYS[3], KEYS[4]

-- ZREM in chunks: unpack of a long list would overflow the Lua C stack.
local function zrem(key, ids)
  for i = 1, #ids, 1000 do
    redis.call('ZREM', key, unpack(ids, i, math.min(i + 999, #ids)))
  end
end

-- Expired leases go first, so nothing below can see or revive them.
redis.call('ZREMRANGEBYSCORE', holders, '-inf', nowS)
local dead = redis.call('ZRANGEBYSCORE', waiting, '-inf', nowS)
if #dead > 0 then
  zrem(queue, dead)
  redis.call('ZREMRANGEBYSCORE', waiting, '-inf', nowS)
end

local i = 12
local released, left, renewed, refreshed, acquired = {}, {}, {}, {}, {}

for n = 1, nRelease do
  released[n] = redis.call('ZREM', holders, ARGV[i])
  i = i + 1
end

for n = 1, nLeave do
  local id = ARGV[i]
  i = i + 1
  if redis.call('ZREM', holders, id) == 1 then
    left[n] = 2
  elseif redis.call('ZREM', queue, id) == 1 then
    redis.call('ZREM', waiting, id)
    left[n] = 1
  else
    left[n] = 0
  end
end

local leaseEnd = us(now + leaseTTL)
for n = 1, nRenew do
  if redis.call('ZSCORE', holders, ARGV[i]) then
    redis.call('ZADD', holders, 'XX', leaseEnd, ARGV[i])
    renewed[n] = leaseTTL
  else
    renewed[n] = 0
  end
  i = i + 1
end

local waitEnd = us(now + queueTTL)
for n = 1, nRefresh do
  local id, ticket = ARGV[i], tonumber(ARGV[i + 1])
  i = i + 2
  if redis.call('ZSCORE', holders, id) then
    -- Granted while we were not listening: the owner is alive, so the
    -- short grant becomes a full lease.
    redis.call('ZADD', holders, 'XX', leaseEnd, id)
    refreshed[n] = leaseTTL
  elseif redis.call('ZSCORE', queue, id) then
    redis.call('ZADD', waiting, 'XX', waitEnd, id)
    refreshed[n] = 0
  else
    -- Purged as expired although its process is alive (it stalled), or
    -- lost to a restart: back in line at its own ticket.
    redis.call('ZADD', queue, us(ticket), id)
    redis.call('ZADD', waiting, waitEnd, id)
    local last = tonumber(redis.call('GET', seq) or '0')
    if last < ticket then
      redis.call('SET', seq, us(ticket))
    end
    refreshed[n] = -1
  end
end

-- Hand free places to the head of the queue. A grant keeps the waiter's own
-- lease expiry, so a waiter whose process died blocks a place for at most
-- one waiter lease; a live one turns it into a full lease at its next
-- refresh or renewal.
local granted = {}
local wakes = {}
local room = capacity - redis.call('ZCARD', holders)
if room > 0 then
  local heads = redis.call('ZRANGE', queue, 0, room - 1)
  if #heads > 0 then
    for _, id in ipairs(heads) do
      local exp = redis.call('ZSCORE', waiting, id)
      redis.call('ZADD', holders, exp, id)
      local proc = string.match(id, '^([^:]*):')
      if proc == self then
        granted[#granted + 1] = id
        granted[#granted + 1] = tonumber(exp) - now
      elseif proc then
        local w = wakes[proc]
        if w then w[#w + 1] = id else wakes[proc] = {id} end
      end
    end
    zrem(queue, heads)
    zrem(waiting, heads)
    room = room - #heads
  end
end
for proc, ids in pairs(wakes) do
  redis.call('PUBLISH', chanPrefix .. proc, table.concat(ids, ' '))
end

-- Arrivals: served at once only if nobody is ahead of them.
local queued = redis.call('ZCARD', queue)
for n = 1, nAcquire do
  local id = ARGV[i]
  i = i + 1
  if queued == 0 and room > 0 then
    redis.call('ZADD', holders, leaseEnd, id)
    room = room - 1
    acquired[2 * n - 1] = 1
    acquired[2 * n] = leaseTTL
  elseif maxQueue > 0 and queued >= maxQueue then
    acquired[2 * n - 1] = -1
    acquired[2 * n] = 0
  else
    local ticket = redis.call('INCR', seq)
    redis.call('ZADD', queue, ticket, id)
    redis.call('ZADD', waiting, waitEnd, id)
    queued = queued + 1
    acquired[2 * n - 1] = 0
    acquired[2 * n] = ticket
  end
end

-- Every key lives a second longer than the last lease in it; an idle
-- semaphore leaves nothing behind. Computed from the data, not from this
-- caller's TTLs, so a process with shorter TTLs cannot expire the keys
-- under another's live lease.
local last = 0
local h = redis.call('ZRANGE', holders, -1, -1, 'WITHSCORES')
if h[2] then last = tonumber(h[2]) end
local w = redis.call('ZRANGE', waiting, -1, -1, 'WITHSCORES')
if w[2] and tonumber(w[2]) > last then last = tonumber(w[2]) end
if last == 0 then
  redis.call('DEL', holders, queue, waiting, seq)
else
  local ms = math.ceil((last - now) / 1000) + 1000
  redis.call('PEXPIRE', holders, ms)
  if queued > 0 then
    redis.call('PEXPIRE', queue, ms)
    redis.call('PEXPIRE', waiting, ms)
    redis.call('PEXPIRE', seq, ms)
  else
    redis.call('DEL', seq)
  end
end

local wait = -1
if queued > 0 and room <= 0 then
  local first = redis.call('ZRANGE', holders, 0, 0, 'WITHSCORES')
  if first[2] then wait = tonumber(first[2]) - now end
end

return {released, left, renewed, refreshed, acquired, granted, wait}
