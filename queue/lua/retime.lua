-- retime.lua: a caller that comes too late to use its slot (its process
-- was starved or frozen past MaxLateness) keeps its place. When the
-- tokens of the slot it missed were still in the bucket, unused, all
-- along (refund.lua says when that is exact: at saturation it always
-- is), its grant moves to now: it starts at once, with them. Otherwise
-- those tokens are spent, and it is given the next slot the bucket has,
-- ahead of every caller still queued. Either way a late caller adds no
-- arrival to the queue, and under overload, where many callers come late,
-- the bucket keeps granting at its rate: a late caller is served when its
-- process runs, as a limiter that takes a token at that moment would.
--
-- A caller whose grant could not move claims, instead, a slot whose
-- caller did not come for it, when the due set holds one in its window
-- (claim.lua), or an older one whose grant can move to now as its own
-- could not: it starts at once with that one, and that caller is served
-- as one too late for its slot when it comes (TAKEN). Otherwise, when
-- the next slot is further off than the lead and callers of other
-- handles are in the due set (claim.lua's others_due), it is written as
-- the step writes one, for the caller to poll for (as entry, ARGV[6]),
-- rather than told: a process that stopped once (a pod at its CPU limit)
-- may stop again before it, and a slot its caller has not polled for is
-- one a running caller can claim, where one it was told would be lost.
--
-- KEYS[1] queue, KEYS[2] state, KEYS[3] config (as in enqueue.lua),
-- KEYS[4] refunds (unused; kept for the key list's shape), KEYS[5] slot
-- key prefix, KEYS[6] due (claim.lua)
-- ARGV[1] the missed slot's value, "<slot> <room>" (entry.lua; "" when
--         it was given without a room)
-- ARGV[2] the caller's costs, "c1,c2,..." ("" for each policy's call)
-- ARGV[3] grace µs added to the state's TTL
-- ARGV[4], ARGV[5] the claim window, µs back from now: lo, hi
--         (protocol.ClaimWindow; 0, 0 claims nothing)
-- ARGV[6] the entry ("<id>|0", entry.lua) under which the caller polls
--         for a next slot further off than the lead; "" to tell it that
--         slot however far
-- ARGV[7] lead µs: a next slot at most this far off is given at once
-- ARGV[8] '1' when a grant may move on no_refill's word (refund.lua): its
--         caller reads replies promptly, so that a grant moved to now
--         starts within MaxLateness of it; '0' otherwise
-- ARGV[9..] policies: configuration id, n, then cap, amount, freq µs, call, kind for each
--
-- Reply {delay µs, kind, room, now µs}: kind 0 the next slot, delay from
-- Redis's now (the missed slot itself, when it is still ahead: the
-- caller was not late); 1 moved: the caller starts now with the missed slot's
-- tokens; 2 claimed another caller's slot (delay 0 or negative); 3 the
-- next slot, delay from now, written for the caller to poll for as
-- ARGV[6]. room is the slot's, for a caller late again ('' for kind 3:
-- its poll tells it).
local now = now_us()
local t0 = slot_of(ARGV[1])
if t0 and t0 > now and room_of(ARGV[1]) ~= TAKEN then
  -- Not late after all (its clock, or its reckoning of Redis's, is off):
  -- its slot stands, tokens and all; nothing changes.
  return {t0 - now, 0, room_of(ARGV[1]), now}
end
local grace = tonumber(ARGV[3])
local lo, hi = tonumber(ARGV[4]), tonumber(ARGV[5])
local again, lead = ARGV[6], tonumber(ARGV[7])
quiet_moves = ARGV[8] == '1'
local ps, _, _, cid = read_policies(ARGV, 9)
local st, done, till = load(KEYS[2], ps, now, KEYS[3], cid)
local cs = parse_costs(ARGV[2])
local ks = {}
for i = 1, #ps do ks[i] = cs and cs[i] or ps[i].call end
local moved = move_now(st, ps, now, grace, ARGV[1], ks, cid)
local slot, kind, value = now, moved and 1 or 0, nil
if not moved and not cs and lo > 0 then
  local taken, tmoved = claim(KEYS[6], KEYS[5], now, lo, hi, again, now, mark_taken(KEYS[6]),
    function(v) return move_now(st, ps, now, grace, v, ks, cid) end)
  if taken and tmoved then
    kind = 2
  elseif taken then
    slot, kind, value = slot_of(taken), 2, taken
  end
end
local as
if kind == 0 then
  slot = slot_k(st, ps, now, ks)
  as = take_at(st, ps, slot, ks, now)
  window_record(st, ps, slot, ks)
end
value = value or slot_value(slot, now, cid, st, '', as)
if kind == 0 and again ~= '' and not cs and slot - now > lead and others_due(KEYS[6], again, now) then
  -- The slot is written as the step writes one (its key, the due set),
  -- for the caller to poll for a lead before it; only while callers of
  -- other handles are in the due set, which could claim it (with none,
  -- the poll would only cost this one's process a round trip).
  local id = entry_parts(again)
  redis.call('SET', KEYS[5] .. id, value, 'PX', ceil_ms(slot - now + grace))
  redis.call('ZADD', KEYS[6], slot, again)
  redis.call('PEXPIRE', KEYS[6], ceil_ms(slot - now + grace)) -- the latest slot given
  kind, value = 3, ''
end
save(KEYS[2], st, ps, now, grace, done, till, KEYS[3])
return {slot - now, kind, room_of(value), now}
