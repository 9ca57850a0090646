-- enqueue.lua: a caller arrives.
--
-- KEYS[1] queue  list of waiting caller IDs, head = next to be scheduled
-- KEYS[2] state  hash: l<i>/a<i> level and anchor of policy i; seq ticket counter
-- KEYS[3] slots  zset: caller ID -> assigned slot (µs, Redis time)
-- KEYS[4] lock   the scheduler lock (bsm/redislock key); only its existence is read
-- ARGV[1] caller ID (fresh per Enter)
-- ARGV[2] lookahead µs: a slot this close may be given without queueing
-- ARGV[3] max queue length, 0 = unbounded
-- ARGV[4] max wait µs, 0 = unbounded
-- ARGV[5] grace µs added to every key's TTL
-- ARGV[6..] policies: n, then cap, amount, freq µs for each
--
-- Reply {kind, delay µs, position, scheduler running 0/1, ticket, slot}:
--   kind 0 granted now; 1 slot given directly, start after delay;
--   2 queued, delay = estimate of the slot; 3 queue full; 4 wait too long
--   (delay = the estimate). Refusals change nothing. slot is the granted
--   slot (µs, Redis time) for kinds 0 and 1, for analysis only.
local now = now_us()
local id = ARGV[1]
local lookahead = tonumber(ARGV[2])
local max_queue = tonumber(ARGV[3])
local max_wait = tonumber(ARGV[4])
local grace = tonumber(ARGV[5])
local ps = read_policies(ARGV, 6)

local st = load(KEYS[2], ps, now)
local qlen = redis.call('LLEN', KEYS[1])

-- Nobody waits: a token due within the lookahead is this caller's at once.
if qlen == 0 then
  local slot = slot_all(st, ps, now, 1)
  if slot - now <= lookahead then
    if max_wait > 0 and slot - now > max_wait then
      return {4, slot - now, 0, 0, 0, 0}
    end
    take(st)
    save(KEYS[2], st, ps, now, grace)
    local ticket = redis.call('HINCRBY', KEYS[2], 'seq', 1)
    if slot == now then
      return {0, 0, 0, 1, ticket, slot}
    end
    return {1, slot - now, 0, 1, ticket, slot}
  end
end

if max_queue > 0 and qlen >= max_queue then
  return {3, 0, qlen, 0, 0, 0}
end
local est = slot_all(st, ps, now, qlen + 1)
if max_wait > 0 and est - now > max_wait then
  return {4, est - now, qlen + 1, 0, 0, 0}
end

redis.call('RPUSH', KEYS[1], id)
redis.call('PEXPIRE', KEYS[1], ceil_ms(est - now + grace))
local ticket = redis.call('HINCRBY', KEYS[2], 'seq', 1)
-- A new state key (first caller ever, or after expiry) must not vanish
-- before the queue it describes.
if redis.call('PTTL', KEYS[2]) < 0 then
  save(KEYS[2], st, ps, now, grace)
end
local running = redis.call('EXISTS', KEYS[4])
return {2, est - now, qlen + 1, running, ticket, 0}
