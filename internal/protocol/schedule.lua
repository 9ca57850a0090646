-- schedule.lua: the scheduler's work, shared by its step (step.lua) and
-- a poll that finds the scheduler late (poll.lua's help): pop, in arrival
-- order, every waiting caller whose slot falls within the lookahead,
-- take its tokens at its slot in the state, write its slot key (with its
-- room: entry.lua) and add it to the due set (claim.lua), and tell the
-- callers whose slot is not the one they expect on the wake channel.
-- Needs tokens.lua, state.lua, entry.lua and wake.lua before it. Each
-- step is atomic and the state lives in Redis, so two runs at once (the
-- scheduler's and a helping poll's) cannot double a slot: the lock only
-- saves work.

-- schedule runs one step's pops on the state st (loaded at now under the
-- configuration cid with policies ps; unit as read_policies says) for the
-- keys {queue, slot (prefix), refunds, due}, giving slots up to
-- lookahead µs ahead, at most batch callers; a slot key outlives its slot
-- by grace µs; callers whose slot comes more than lead µs from their
-- estimate (or who have none) are told on channel (wake_told). It
-- returns how many callers it gave a slot, the queue's length after, and
-- the slot the next caller would have (nil when it would take its tokens
-- as each policy's call: slot_all tells it).
local function schedule(keys, now, lookahead, batch, grace, lead, channel, ps, unit, cid, st)
  local ids, slots, blocked = {}, {}, nil
  local anchors = {} -- per slot, take_at's: its room's (entry.lua)
  -- Each caller's slot follows from the state its predecessors in this
  -- step left (take_at spends their tokens at their slots), and never
  -- comes before theirs.
  local last = now
  local qlen -- the queue's length after this step's pops, when known
  if keys.lanes and lanes_on(keys.lanes) then
    -- Named lanes have callers: whom to serve is lanes.lua's choice.
    blocked, qlen, last = lanes_pop(keys.lanes, st, ps, now, lookahead, batch, last, ids, slots, anchors)
  elseif unit and st.costed == 0 then
    -- Every caller queued takes one token of each policy: how many have
    -- their slot within the lookahead follows from the state alone; pop
    -- them at once.
    -- One token bucket sets every slot itself, none of its refills lost to
    -- its capacity before the slot (its level there is at most its refill):
    -- take_at would take nothing more than the token.
    local one = #ps == 1 and ps.rolling == 0
    local total = redis.call('LLEN', keys.queue)
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
        note_peak(st, 1, lag_peak(p, v, slot, at), slot)
        s.anchor = s.anchor + lag_shift(p, v, slot, at) -- take_at's lag
        s.level = s.level - 1
        anchors[n] = {slot_anchor(p, s, slot, at)}
      else
        anchors[n] = take_at(st, ps, slot, nil, now)
        window_record(st, ps, slot, nil)
      end
    end
    if n > 0 then ids = redis.call('LPOP', keys.queue, n) or {} end
    qlen = total - #ids
  else
    -- Costs differ: read the head of the queue a few entries at a time
    -- until a slot falls beyond the lookahead.
    local from, stop = 0, false
    while not stop and #ids < batch do
      local chunk = redis.call('LRANGE', keys.queue, from, from + math.min(batch - #ids, 32) - 1)
      if #chunk == 0 then break end
      for _, e in ipairs(chunk) do
        local slot, costs, ks = next_slot(st, ps, e, last, now)
        if slot - now > lookahead or #ids >= batch then
          blocked, stop = slot, true
          break
        end
        give_slot(st, ps, e, slot, costs, ks, now, ids, slots, anchors)
        last = slot
      end
      from = from + #chunk
    end
    if #ids > 0 then
      redis.call('LTRIM', keys.queue, #ids, -1)
    end
  end
  local early = {} -- the wake message (wake.lua)
  local refunds = ''
  local due = {} -- ZADD's arguments: score, member, ...
  if #ids > 0 then refunds = redis.call('GET', keys.refunds) or '' end
  for k, id in ipairs(ids) do
    local slot = slots[k]
    -- A slot key per caller, read and deleted by its poll; one its caller
    -- never collects (it died) expires grace after the slot. It carries the
    -- room (entry.lua's slot_value) for a caller that comes too late.
    local bare, est, costs = entry_parts(id)
    redis.call('SET', keys.slot .. bare, slot_value(slot, now, cid, st, refunds, anchors[k]), 'PX', ceil_ms(slot - now + grace))
    if not costs then
      due[#due + 1] = slot
      due[#due + 1] = id
    end
    -- An estimate of 0: pushed without one (queue/push.go); its caller
    -- waits for this message, as does one told its slot moved later.
    if est and wake_told(est, slot, lead) then
      wake_add(early, id, slot)
    end
  end
  local scheduled = #ids
  wake_publish(channel, early)
  if #due > 0 then
    -- Slots no claimer's window reaches any more (claim.lua: 1 s at most,
    -- protocol.ClaimReach) go first.
    redis.call('ZREMRANGEBYSCORE', keys.due, '-inf', '(' .. string.format('%d', now - 1000000))
    for b = 1, #due, 4096 do
      redis.call('ZADD', keys.due, unpack(due, b, math.min(b + 4095, #due)))
    end
    redis.call('PEXPIRE', keys.due, ceil_ms(slots[#ids] - now + grace))
  end
  qlen = qlen or redis.call('LLEN', keys.queue)
  return scheduled, qlen, blocked or math.max(last, slot_all(st, ps, now, 1))
end
