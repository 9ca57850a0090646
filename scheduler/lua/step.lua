-- step.lua: one step of the scheduler, fenced by its lock token. Pops, in
-- arrival order, every waiting caller whose slot falls within the lookahead,
-- writes its slot, saves the bucket, and releases the lock when the queue is
-- empty: all in one atomic script, so two schedulers at once cannot double
-- a slot, and a caller that enqueues while the scheduler stops always sees
-- it stopped (enqueue reads the state's until, which the step zeroes in
-- the same script as it deletes the lock) and starts a new one.
--
-- KEYS[1] queue, KEYS[2] state, KEYS[3] slot key prefix, KEYS[4] lock,
-- KEYS[5] config (as in enqueue.lua), KEYS[6] refunds (retime.lua)
-- ARGV[1] lock token; the step does nothing unless the lock holds it
-- ARGV[2] lock TTL ms, renewed on every step that keeps the lock; 0 hands
--         the lock over: the step releases it (and zeroes until, so that
--         the next caller to enqueue starts a scheduler) even if callers
--         still wait
-- ARGV[3] lookahead µs
-- ARGV[4] max callers to schedule in this step
-- ARGV[5] grace µs added to every key's TTL; a slot key outlives its slot by this
-- ARGV[6] lead µs: callers poll this long before their estimated slot
-- ARGV[7] wake channel: entries whose slot comes earlier than their
--         estimate less the lead, or whose estimate is 0 (pushed without
--         one), are published there with their slot, as space-separated
--         pairs "entry slot-µs" (wake.lua), so that their process polls in time
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
local ids, slots, blocked = {}, {}, nil
-- Each caller's slot follows from the state its predecessors in this
-- step left (take_at spends their tokens at their slots), and never
-- comes before theirs.
local last = now
local qlen -- the queue's length after this step's pops, when known
if unit and st.costed == 0 then
  -- Every caller queued takes one token of each policy: how many have
  -- their slot within the lookahead follows from the state alone; pop
  -- them at once.
  -- One token bucket sets every slot itself, none of its refills lost to
  -- its capacity before the slot (its level there is at most its refill):
  -- take_at would take nothing more than the token.
  local one = #ps == 1 and ps.rolling == 0
  local total = redis.call('LLEN', KEYS[1])
  local n, qn = 0, math.min(batch, total)
  while n < qn do
    local slot = math.max(last, slot_all(st, ps, now, 1))
    if slot - now > lookahead then break end
    n = n + 1
    slots[n], last = slot, slot
    if one then
      -- take_at's peak, without its refill: the level reaches the token
      -- at the slot and loses nothing to the capacity before it.
      local s, p = st[1], ps[1]
      local v, at = s.level, s.anchor
      if v < 1 and slot > s.anchor then
        local n = math.floor((slot - s.anchor) / p.freq)
        v, at = math.min(p.cap, v + n * p.amount), s.anchor + n * p.freq
      end
      note_peak(st, 1, v, slot)
      s.anchor = s.anchor + lag_shift(p, v, slot, at) -- take_at's lag
      s.level = s.level - 1
    else
      take_at(st, ps, slot, nil, now)
      window_record(st, ps, slot, nil)
    end
  end
  if n > 0 then ids = redis.call('LPOP', KEYS[1], n) or {} end
  qlen = total - #ids
else
  -- Costs differ: read the head of the queue a few entries at a time
  -- until a slot falls beyond the lookahead.
  local from, stop = 0, false
  while not stop and #ids < batch do
    local chunk = redis.call('LRANGE', KEYS[1], from, from + math.min(batch - #ids, 32) - 1)
    if #chunk == 0 then break end
    for _, e in ipairs(chunk) do
      local _, _, costs = entry_parts(e)
      local ks = {}
      for k = 1, #ps do ks[k] = costs and costs[k] or ps[k].call end
      local slot = math.max(last, slot_k(st, ps, now, ks))
      if slot - now > lookahead or #ids >= batch then
        blocked, stop = slot, true
        break
      end
      ids[#ids + 1] = e
      slots[#ids], last = slot, slot
      take_at(st, ps, slot, ks, now)
      window_record(st, ps, slot, ks)
      if costs then
        st.costed = st.costed - 1
        for j = 1, #ps do st[j].extra = st[j].extra - (costs[j] - ps[j].call) end
      end
    end
    from = from + #chunk
  end
  if #ids > 0 then
    redis.call('LTRIM', KEYS[1], #ids, -1)
  end
end
local early = {} -- the wake message (wake.lua)
local refunds = ''
if #ids > 0 then refunds = redis.call('GET', KEYS[6]) or '' end
for k, id in ipairs(ids) do
  local slot = slots[k]
  -- A slot key per caller, read and deleted by its poll; one its caller
  -- never collects (it died) expires grace after the slot. It carries the
  -- room (entry.lua's slot_value) for a caller that comes too late.
  local bare, est = entry_parts(id)
  redis.call('SET', KEYS[3] .. bare, slot_value(slot, now, cid, st, refunds), 'PX', ceil_ms(slot - now + grace))
  -- An estimate of 0: pushed without one (queue/push.go); its caller
  -- waits for this message.
  if est and (est == 0 or slot < est - lead) then
    wake_add(early, id, slot)
  end
end
local scheduled = #ids
wake_publish(channel, early)

qlen = qlen or redis.call('LLEN', KEYS[1])
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
local tail = slot_k(st, ps, now, ahead_k(st, ps, qlen - 1, nil))
redis.call('PEXPIRE', KEYS[1], ceil_ms(tail - now + grace))
-- The head's slot, now that those ahead of it took their tokens; read
-- above when costs differ.
local next = (blocked or math.max(last, slot_all(st, ps, now, 1))) - lookahead - now
if next < 0 or scheduled >= batch then next = 0 end
return {status, next, qlen, scheduled}
