-- step.lua: one step of the scheduler, fenced by its lock token. Pops, in
-- arrival order, every waiting caller whose slot falls within the lookahead,
-- writes its slot, saves the bucket, and releases the lock when the queue is
-- empty: all in one atomic script, so two schedulers at once cannot double
-- a slot, and a caller that enqueues while the scheduler stops always sees
-- the lock gone (enqueue reads it) and starts a new one.
--
-- KEYS[1] queue, KEYS[2] state, KEYS[3] slots, KEYS[4] lock (as in enqueue.lua)
-- ARGV[1] lock token; the step does nothing unless the lock holds it
-- ARGV[2] lock TTL ms, renewed on every step that keeps the lock
-- ARGV[3] lookahead µs
-- ARGV[4] max callers to schedule in this step
-- ARGV[5] grace µs added to every key's TTL; slots older than this are dropped
-- ARGV[6] lead µs: callers poll this long before their estimated slot
-- ARGV[7] wake channel: entries whose slot comes earlier than their
--         estimate less the lead are published there, space-separated, so
--         that their process wakes them in time
-- ARGV[8..] policies: n, then cap, amount, freq µs for each
--
-- Reply {status, next µs, queue length, scheduled}:
--   status -1 fenced (the lock is not ours: stop); 0 queue empty, lock
--   released; 1 callers still wait: step again in next µs (0 = at once).
if redis.call('GET', KEYS[4]) ~= ARGV[1] then
  return {-1, 0, 0, 0}
end
local now = now_us()
local lock_ttl = ARGV[2]
local lookahead = tonumber(ARGV[3])
local batch = tonumber(ARGV[4])
local grace = tonumber(ARGV[5])
local lead = tonumber(ARGV[6])
local channel = ARGV[7]
local ps = read_policies(ARGV, 8)

-- Slots never collected (their caller died) go once they are stale.
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. int(now - grace))

local st, seq = load(KEYS[2], ps, now)
local scheduled = 0
local last = now
local early = {}
while scheduled < batch do
  local slot = slot_all(st, ps, now, 1)
  if slot - now > lookahead then break end
  local id = redis.call('LPOP', KEYS[1])
  if not id then break end
  take(st)
  redis.call('ZADD', KEYS[3], int(slot), id)
  local est = tonumber(string.match(id, '|(%d+)$'))
  if est and slot < est - lead then
    early[#early + 1] = id
  end
  scheduled = scheduled + 1
  last = slot
end
if #early > 0 then
  redis.call('PUBLISH', channel, table.concat(early, ' '))
end
if scheduled > 0 then
  save(KEYS[2], st, ps, now, grace, seq)
  local pttl = redis.call('PTTL', KEYS[3])
  local want = tonumber(ceil_ms(last - now + grace))
  if pttl < want then
    redis.call('PEXPIRE', KEYS[3], want)
  end
end

local qlen = redis.call('LLEN', KEYS[1])
if qlen == 0 then
  redis.call('DEL', KEYS[4])
  return {0, 0, 0, scheduled}
end
redis.call('PEXPIRE', KEYS[4], lock_ttl)
local tail = slot_all(st, ps, now, qlen)
redis.call('PEXPIRE', KEYS[1], ceil_ms(tail - now + grace))
local next = slot_all(st, ps, now, 1) - lookahead - now
if next < 0 or scheduled >= batch then next = 0 end
return {1, next, qlen, scheduled}
