-- enqueue.lua: callers arrive, one or many at once (a process batches the
-- arrivals of its concurrent callers into one call). They are handled in
-- the order given, each exactly as if it had come alone.
--
-- KEYS[1] queue  list of waiting callers' entries, head = next to be scheduled
-- KEYS[2] state  string "done until l1 a1 ... format id": state.lua
-- KEYS[3] config the configuration in force, "<format> <id> <json>"; read
--         only when the state does not carry this process's id (state.lua)
-- KEYS[4] slot key prefix, KEYS[5] refunds, KEYS[6] due: for the help
-- (the state's until tells whether a scheduler holds the lock; the lock
-- itself is the step's, a bsm/redislock key)
-- KEYS[7..10] the lanes' keys (lanes.lua): the prefix of the named
--         lanes' lists, the set of classes, the prefix of the classes'
--         sets, the tags
-- A caller is queued in its lane's list (its ID names it: lanes.lua);
-- its position and the estimate of its slot count its lane only, the
-- lanes that share its class too when named lanes have callers; it is
-- given its slot at once only while nobody waits in any lane. MaxQueue
-- bounds each lane's list.
-- ARGV[1] lookahead µs: a slot this close may be given without queueing
-- ARGV[2] max queue length, 0 = unbounded
-- ARGV[3] max wait µs, 0 = unbounded
-- ARGV[4] grace µs added to every key's TTL
-- ARGV[5..7] the step's max callers, lead µs and wake channel (as
--         step.lua's), for the help
-- ARGV[8..] policies: configuration id, n, then cap, amount, freq µs, call, kind for each
-- ARGV[after policies] m, then for each of m callers its ID (fresh per
--         Enter), its costs, "c1,c2,..." one per policy, or "" to take
--         each policy's call (entry.lua), and the longest it may wait, µs
--         (0: only the bucket's max wait bounds it; its ctx's deadline
--         otherwise, so that a caller who cannot be served in time is
--         refused at once, taking no place and no token)
--
-- A queued caller is stored as its entry (entry.lua), "<id>|<estimated slot µs>[|<costs>]": the
-- scheduler compares the slot it assigns with the estimate the caller sleeps
-- on, and wakes the caller when the slot came earlier (callers ahead left).
-- Reply: {now µs, flags, first ticket}, then 3 integers
-- per caller, {kind, delay µs, position}; flags: 1 the scheduler is
-- running (callers were queued and its lock held), 2 named lanes have
-- callers (a queued caller's delay is its share's estimate):
--   kind 0 granted now; 1 slot given directly, start after delay;
--   2 queued, delay = estimate of the slot; 3 queue full; 4 wait too long
--   (delay = the estimate: the bucket's max wait or the caller's own was
--   shorter). Refusals change nothing.
-- Tickets (arrival order at Redis) go to granted and queued callers in
-- order, from the first ticket up. now + delay is the slot (kinds 0, 1)
-- or the estimate stored in the caller's entry (kind 2).
--
-- Cost: this runs once per arrival (or batch of arrivals), so it does as
-- few commands as it can. A caller that queues costs TIME, GET, LLEN and
-- RPUSH, plus PEXPIRE when it creates the queue (later the scheduler's
-- steps renew the queue's TTL); one granted at once costs TIME, GET, LLEN
-- and SET.
local now = now_us()
local lookahead = tonumber(ARGV[1])
local max_queue = tonumber(ARGV[2])
local max_wait = tonumber(ARGV[3])
local grace = tonumber(ARGV[4])
local ps, i, unit, id = read_policies(ARGV, 8)
local m = tonumber(ARGV[i])
local st, done, till, fresh, raw = load(KEYS[2], ps, now, KEYS[3], id)
local lk = {queue = KEYS[1], prefix = KEYS[7], classes = KEYS[8], class = KEYS[9], tags = KEYS[10]}
local dlen = redis.call('LLEN', KEYS[1])
-- named says whether named lanes have callers: asked once, when needed.
local on
local function named()
  if on == nil then on = lanes_on(lk) end
  return on
end
local created = dlen == 0
local took, costed, tail = false, false, now
if dlen > 0 or named() then
  -- The help: the head of the queue could have had its slot a lookahead
  -- ago and no step gave it (the scheduler's process is starved or
  -- stopped: a pod at its CPU limit; a running scheduler gives slots a
  -- lookahead ahead), so its tokens sit unpromised in the bucket,
  -- which may fill and lose them. An arrival, whose process runs, does
  -- the step's work first (schedule.lua): the callers due within the
  -- lookahead get their slots, in their order. The lock stays the
  -- scheduler's; the state lives here, so two steps at once cannot
  -- double a slot.
  local head
  if unit and st.costed == 0 then
    head = slot_all(st, ps, now, 1)
  else
    head = slot_k(st, ps, now, ahead_k(st, ps, 0, nil)) -- all extras: at most the head's slot's
  end
  if head <= now - lookahead then
    local keys = {queue = KEYS[1], slot = KEYS[4], refunds = KEYS[5], due = KEYS[6], lanes = lk}
    local scheduled, left = schedule(keys, now, lookahead, tonumber(ARGV[5]), grace, tonumber(ARGV[6]), ARGV[7], ps, unit, id, st)
    if scheduled > 0 then
      done, took = done + scheduled, true
      dlen, on = redis.call('LLEN', KEYS[1]), nil
      if left == 0 then
        st.costed = 0 -- nothing queued: no extras either
        for k = 1, #ps do st[k].extra = 0 end
      end
    end
  end
end
if st.costed ~= 0 and dlen == 0 and not named() then
  -- The queue is gone (drained, or expired): so are its callers' extras.
  st.costed, costed = 0, true
  for k = 1, #ps do st[k].extra = 0 end
end
local first = done + dlen + 1
local out, n = {now, 0, first}, 3
local lens, pushed, order = {[''] = dlen}, {}, {}
-- above says whether priority p is above every class with callers: a
-- caller of it whose lane is empty is the one a step would serve next.
local top
local function above(p)
  if p == 0 then return false end
  if not top then
    local t = redis.call('ZRANGE', lk.classes, 0, 0)
    top = t[1] and tonumber(t[1]) or -1
  end
  return p > top
end
local queued = false -- a caller of this batch queued: nobody after it is alone
-- Each caller's reply is written in place (no table per caller, no
-- function call, no # operator, unless it has costs of its own, waits
-- behind one that has, or names a lane): a batch may hold hundreds of
-- callers.
for c = 1, m do
  local id, cs, mine = ARGV[i + 3 * c - 2], ARGV[i + 3 * c - 1], tonumber(ARGV[i + 3 * c])
  local costs = parse_costs(cs)
  local limit = max_wait
  if mine > 0 and (limit == 0 or mine < limit) then limit = mine end
  local name, _, p = lane_of(id)
  local qlen = lens[name]
  if not qlen then
    qlen = redis.call('LLEN', lane_list(lk, name))
    lens[name] = qlen
  end
  local slot
  if unit and not costs and st.costed == 0 then
    slot = slot_all(st, ps, now, qlen + 1)
  elseif qlen == 0 and costs then -- nobody ahead: the costs alone
    slot = slot_k(st, ps, now, costs)
  else
    slot = slot_k(st, ps, now, ahead_k(st, ps, qlen, costs))
  end
  if qlen == 0 and (not queued and dlen == 0 and not named() or above(p)) and slot - now <= lookahead then
    -- Nobody waits (or only lower priorities' callers do, whom a step
    -- would serve after it): a slot due within the lookahead is this
    -- caller's at once.
    if limit > 0 and slot - now > limit then
      out[n + 1], out[n + 2], out[n + 3], n = 4, slot - now, 0, n + 3
    else
      take_at(st, ps, slot, costs, now) -- nobody queued: no extras, costs or each one's call
      window_record(st, ps, slot, costs)
      took = true
      done = done + 1
      out[n + 1], out[n + 2], out[n + 3], n = slot == now and 0 or 1, slot - now, 0, n + 3
    end
  elseif max_queue > 0 and qlen >= max_queue then
    out[n + 1], out[n + 2], out[n + 3], n = 3, 0, qlen, n + 3
  elseif limit > 0 and slot - now > limit then
    -- Refused only when even its own lane's callers alone, at the full
    -- rate, keep it past its wait.
    out[n + 1], out[n + 2], out[n + 3], n = 4, slot - now, qlen + 1, n + 3
  else
    if named() then
      -- It shares its class's rate with the lanes that have callers: its
      -- estimate counts each of them as far ahead as its own.
      local k = lane_count(lk, name, p, lens[''])
      if k > 1 then
        local ahead = (qlen + 1) * k - 1
        if unit and not costs and st.costed == 0 then
          slot = slot_all(st, ps, now, ahead + 1)
        else
          slot = slot_k(st, ps, now, ahead_k(st, ps, ahead, costs))
        end
      end
    end
    lens[name] = qlen + 1
    queued = true
    local list = pushed[name]
    if not list then
      list = {}
      pushed[name], order[#order + 1] = list, name
    end
    list[#list + 1] = entry(id, slot, cs)
    if name == '' then tail = slot end
    if costs then
      st.costed = st.costed + 1
      for k = 1, #ps do st[k].extra = st[k].extra + costs[k] - ps[k].call end
      costed = true
    end
    out[n + 1], out[n + 2], out[n + 3], n = 2, slot - now, qlen + 1, n + 3
  end
end
for _, name in ipairs(order) do
  local list = pushed[name]
  local key = lane_list(lk, name)
  redis.call('RPUSH', key, unpack(list))
  if name ~= '' or named() then
    redis.call('PEXPIRE', key, LANE_TTL)
    if lens[name] == #list then
      local _, w, p = lane_of(list[1])
      lane_join(lk, name, w, p, list[1], ps)
    end
  elseif created then
    redis.call('PEXPIRE', key, ceil_ms(tail - now + grace))
  end
end
if #order > 0 and till > now then out[2] = 1 end
if on then out[2] = out[2] + 2 end -- named lanes have callers
-- Save when tokens were taken, a caller with costs queued, or the state is
-- new (a new state key must not vanish before the queue it describes);
-- a state of an older format is saved in this one when anything is.
-- When only callers with costs queued, the levels are as stored: write
-- the extras after them.
if took or fresh or (costed and not raw) then
  save(KEYS[2], st, ps, now, grace, done, till, KEYS[3])
elseif costed then
  save_extras(KEYS[2], raw, st)
end
return out
