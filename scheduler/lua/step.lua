-- step.lua: one step of the scheduler, fenced by its lock token. Pops, in
-- arrival order, every waiting caller whose slot falls within the lookahead,
-- writes its slot (schedule.lua), saves the bucket, and releases the lock
-- when the queue is empty: all in one atomic script, so two schedulers at once cannot double
-- a slot, and a caller that enqueues while the scheduler stops always sees
-- it stopped (enqueue reads the state's until, which the step zeroes in
-- the same script as it deletes the lock) and starts a new one.
--
-- KEYS[1] queue, KEYS[2] state, KEYS[3] slot key prefix, KEYS[4] lock,
-- KEYS[5] config (as in enqueue.lua), KEYS[6] refunds (retime.lua),
-- KEYS[7] due: the slots written and not yet collected (claim.lua); the
-- step adds those of callers of the bucket's own costs
-- KEYS[8..11] the lanes' keys (lanes.lua): the prefix of the named
-- lanes' lists, the set of classes, the prefix of the classes' sets, the
-- tags. With named lanes, whom to pop next is lanes.lua's choice.
-- ARGV[1] lock token; the step does nothing unless the lock holds it
-- ARGV[2] lock TTL ms, renewed on every step that keeps the lock; 0 hands
--         the lock over: the step releases it (and zeroes until, so that
--         the next caller to enqueue starts a scheduler) even if callers
--         still wait
-- ARGV[3] lookahead µs
-- ARGV[4] max callers to schedule in this step
-- ARGV[5] grace µs added to every key's TTL; a slot key outlives its slot by this
-- ARGV[6] lead µs: callers poll this long before their estimated slot
-- ARGV[7] wake channel: entries whose slot comes more than the lead from
--         their estimate (earlier or later), or whose estimate is 0
--         (pushed without one), are published there with their slot, as
--         space-separated pairs "entry slot-µs" (wake.lua's wake_told), so
--         that their process polls in time
-- ARGV[8..] policies: configuration id, n, then cap, amount, freq µs, call, kind for each
--
-- Reply {status, next µs, queue length, scheduled}:
--   status -1 fenced (the lock is not ours: stop); 0 lock released (the
--   queue is empty, or the step handed the lock over); 1 callers still
--   wait: step again in next µs (0 = at once).
if redis.call('GET', KEYS[4]) ~= ARGV[1] then
  return {-1, 0, 0, 0}
end
local now = now_us()
local lock_ttl = tonumber(ARGV[2])
local lookahead = tonumber(ARGV[3])
local batch = tonumber(ARGV[4])
local grace = tonumber(ARGV[5])
local lead = tonumber(ARGV[6])
local channel = ARGV[7]
local ps, _, unit, cid = read_policies(ARGV, 8)
local st, done = load(KEYS[2], ps, now, KEYS[5], cid)
local lk = {queue = KEYS[1], prefix = KEYS[8], classes = KEYS[9], class = KEYS[10], tags = KEYS[11]}
local k = {queue = KEYS[1], slot = KEYS[3], refunds = KEYS[6], due = KEYS[7], lanes = lk}
local scheduled, qlen, head = schedule(k, now, lookahead, batch, grace, lead, channel, ps, unit, cid, st)
if qlen == 0 then
  st.costed = 0 -- nothing queued: no extras either
  for k = 1, #ps do st[k].extra = 0 end
  redis.call('DEL', KEYS[4])
  save(KEYS[2], st, ps, now, grace, done + scheduled, 0, KEYS[5])
  return {0, 0, 0, scheduled}
end
-- The lock and the state's until are renewed together: enqueue reads
-- until instead of the lock.
local status = 1
if lock_ttl == 0 then
  status = 0
  redis.call('DEL', KEYS[4])
  save(KEYS[2], st, ps, now, grace, done + scheduled, 0, KEYS[5])
else
  redis.call('PEXPIRE', KEYS[4], lock_ttl)
  save(KEYS[2], st, ps, now, grace, done + scheduled, now + lock_ttl * 1000, KEYS[5])
end
if not lanes_on(lk) then
  -- (With named lanes, lanes.lua keeps every lane's list a while.)
  local tail = slot_k(st, ps, now, ahead_k(st, ps, qlen - 1, nil))
  redis.call('PEXPIRE', KEYS[1], ceil_ms(tail - now + grace))
end
-- The head's slot, now that those ahead of it took their tokens.
local next = head - lookahead - now
if next < 0 or scheduled >= batch then next = 0 end
return {status, next, qlen, scheduled}
