-- claim.lua: a running caller takes a slot whose own caller did not come
-- for it (its process stopped: a pod at its CPU limit, a starved host).
-- Needs tokens.lua and entry.lua before it; claim_for also state.lua and
-- queue/lua's refund.lua.
--
-- The step adds every slot it writes for a caller of the bucket's own
-- costs to the due set (a sorted set: member the caller's entry, score
-- its slot); a poll that collects the slot takes it out. A slot still in
-- the set some time after its instant was not collected: its caller is
-- not running. A caller that is running claims it:
--   - one that holds a later slot (a poll that found its slot ahead)
--     swaps with it: the uncollected slot's key holds the later slot
--     instead, marked (SWAPPED) so that its caller knows it was passed
--     over (swap_to);
--   - one that holds none (a caller still queued whose poll finds one,
--     or a late caller whose own tokens could not move) takes it: the
--     uncollected slot's key says TAKEN (entry.lua), and its caller, when
--     it comes, is served as one too late for its slot (mark_taken).
-- The grants keep the instants and the tokens the steps gave them, so
-- the limit holds by construction; only who starts at which changes. The
-- window [lo, hi] (Redis µs) is the claimer's: hi far enough after the
-- slot that its caller, which polls a lead before it, is surely not
-- running; lo near enough that the claimer, starting at once, starts
-- within its MaxLateness of the slot. An older slot is claimed only when
-- its grant can move to now (refund.lua).

-- SWAPPED ends the slot value given in exchange (entry.lua's slot_value
-- then " s"); the room's readers ignore what follows the anchors.
local SWAPPED = ' s'

-- CLAIM_REACH is the furthest back (µs) a claim looks: protocol.ClaimReach.
local CLAIM_REACH = 1000000

-- own_prefix is the prefix the IDs of a handle's callers share, up to
-- the first '.', of the entry or ID e (nil when it has none).
local function own_prefix(e)
  return (string.match(e, '^[^.|]*%.')) -- one value: entry.lua's slot_of
end

-- others_due says whether the due set due holds, among its first slots
-- (those a claim still reaches, and later ones), one of a caller of
-- another handle than self's (an entry or ID): another process has
-- callers of this bucket, which could claim a slot self's caller did
-- not come for.
local function others_due(due, self, now)
  local own = own_prefix(self)
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', due, string.format('%d', now - CLAIM_REACH), '+inf', 'LIMIT', 0, 8)) do
    if not own or string.sub(m, 1, #own) ~= own then return true end
  end
  return false
end

-- claim finds, for a running caller (self: its entry, or its ID), the
-- earliest uncollected slot of the due set due (members entries, whose
-- slot keys are prefix .. ID) of another handle's caller that lies
-- between lo and hi µs before now, or, with move, an older one (up to
-- CLAIM_REACH back) when move(value) moves that slot's grant to now
-- (refund.lua's unused_back: its tokens sat unused in a bucket that never
-- filled since): the claimer then starts now with them. Only a claimer
-- whose own slot comes after now - hi gains: mine (µs; one that holds
-- none passes now). give(member, key, slot) tells the caller that did
-- not come (swap_to, mark_taken); slot is the one taken. It returns the
-- value taken (unmarked) and whether it moved; nil when there is none.
-- Entries older than CLAIM_REACH go.
local function claim(due, prefix, now, lo, hi, self, mine, give, move)
  redis.call('ZREMRANGEBYSCORE', due, '-inf', '(' .. string.format('%d', now - CLAIM_REACH))
  if hi >= lo or mine <= now - hi then return nil end
  local from = move and now - CLAIM_REACH or now - lo
  local ms = redis.call('ZRANGEBYSCORE', due, string.format('%d', from), string.format('%d', now - hi), 'LIMIT', 0, 8)
  -- The callers of one handle (their IDs share its prefix, up to the
  -- first '.') run in one process: when the claimer runs, so do they,
  -- only slower, and taking their slots would only pass tokens around
  -- among them, each pass a retime. A claim takes from other handles.
  local own = own_prefix(self)
  for _, m in ipairs(ms) do
    if m ~= self and not (own and string.sub(m, 1, #own) == own) then
      local key = prefix .. entry_parts(m)
      local raw = redis.call('GET', key)
      local t = raw and slot_of(raw)
      if not t or t < from or t > now - hi then
        redis.call('ZREM', due, m) -- collected, given up, expired, or given a later slot
      else
        if string.sub(raw, -#SWAPPED) == SWAPPED then raw = string.sub(raw, 1, -#SWAPPED - 1) end
        local moved = t < now - lo
        if not moved or move(raw) then
          give(m, key, t)
          return raw, moved
        end
        -- Its tokens would not have stayed in the bucket: later they
        -- will not either (the peaks since its slot only rise). Its
        -- caller keeps it, to move or spend when it comes.
        redis.call('ZREM', due, m)
      end
    end
  end
  return nil
end

-- swap_to is claim's give for a claimer that holds a slot: the slot key
-- of the caller that did not come holds the claimer's value v (its slot
-- at slot µs, px ms to live), marked SWAPPED, and the due set has it at
-- that slot.
local function swap_to(due, v, slot, px)
  if string.sub(v, -#SWAPPED) ~= SWAPPED then v = v .. SWAPPED end
  return function(m, key)
    redis.call('SET', key, v, 'PX', math.max(px, 1))
    redis.call('ZADD', due, slot, m)
  end
end

-- mark_taken is claim's give for a claimer that holds no slot: the slot
-- key of the caller that did not come says TAKEN, with its expiry, and
-- the due set lets that caller go.
local function mark_taken(due)
  return function(m, key, t)
    redis.call('SET', key, string.format('%d ', t) .. TAKEN, 'KEEPTTL')
    redis.call('ZREM', due, m)
  end
end

-- claim_for is a poll's claim (poll.lua; a direct poll claims nothing):
-- the caller entry (of the bucket's own costs; found ahead, or queued)
-- claims
-- (claim) under the policies in ARGV from index at, the state and config
-- keys state_key and config_key, and grace µs; mine and give as claim's.
-- It returns the poll's reply for a claim, {5, delay µs, 0, 0, slot,
-- room}, or nil when there was none to claim.
local function claim_for(state_key, config_key, prefix, due, now, lo, hi, grace, argv, at, entry, mine, give)
  local ps, _, _, cid = read_policies(argv, at)
  local ks = {}
  for i = 1, #ps do ks[i] = ps[i].call end
  local st, done, till
  local taken, moved = claim(due, prefix, now, lo, hi, entry, mine, give, function(v)
    if not st then st, done, till = load(state_key, ps, now, config_key, cid) end
    return move_now(st, ps, now, grace, v, ks, cid)
  end)
  if not taken then return nil end
  if moved then
    save(state_key, st, ps, now, grace, done, till, config_key)
    return {5, 0, 0, 0, now, room_of(slot_value(now, now, cid, st, ''))}
  end
  local t = slot_of(taken)
  return {5, t - now, 0, 0, t, room_of(taken)}
end

-- free_since is how long (µs), at least, the books have held the tokens
-- of one more grant (each policy's call) that no slot was given: from
-- each policy's level now, less its call, at its refill rate. nil when a
-- policy has not those tokens now, holds (the upstream said to wait), or
-- is a rolling window (whose grants never go back).
local function free_since(st, ps, now)
  if (st.hold or 0) > now then return nil end
  local since
  for i = 1, #ps do
    local p, s = ps[i], st[i]
    if p.kind == ROLLING or s.level < p.call then return nil end
    if p.call > 0 then
      local d = (s.level - p.call) * p.freq / p.amount
      since = since and math.min(since, d) or d
    end
  end
  return since
end

-- take_free is a queued caller's take (poll.lua) of tokens nobody came
-- for: when the books have held the tokens of one more grant for hi µs
-- or more, the callers ahead of it, whose slots they are, did not come
-- (a caller that runs when its turn has come gives the slots due itself:
-- schedule.lua), nor did a scheduler: their processes are stopped. The
-- caller, whose process runs, takes them now, as a claim does (the
-- limit holds: they are the books' own), and leaves the queue; the
-- callers it overtakes keep their places, first in line when they come.
-- Only from another handle's head (claim.lua: one handle's callers run
-- together). It returns the poll's reply, or nil.
local function take_free(qkey, st, ps, now, hi, entry, cid)
  local since = free_since(st, ps, now)
  if not since or since < hi then return nil end
  local head = redis.call('LINDEX', qkey, 0)
  local own = own_prefix(entry)
  if not head or head == entry or (own and string.sub(head, 1, #own) == own) then return nil end
  local as = take_at(st, ps, now, nil, now)
  window_record(st, ps, now, nil)
  redis.call('LREM', qkey, 1, entry)
  return {5, 0, 0, 0, now, room_of(slot_value(now, now, cid, st, '', as))}
end
