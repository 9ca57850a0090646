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
-- A caller of the bucket's own costs given the next slot claims, in
-- exchange for it, a slot whose caller did not come for it, when the due
-- set holds one in its window (claim.lua), or an older one whose grant
-- can move to now as its own could not: it starts at once with that one,
-- and that caller is given the next slot instead.
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
-- ARGV[6..] policies: configuration id, n, then cap, amount, freq µs, call, kind for each
--
-- Reply {delay µs, moved, room, now µs}: the new slot is delay from Redis's now
-- (0 when moved, negative when claimed); moved is 1 when the caller
-- starts now with the missed slot's tokens, 2 when it claimed another
-- caller's slot; room is the new slot's, for a caller late again.
local now = now_us()
local grace = tonumber(ARGV[3])
local lo, hi = tonumber(ARGV[4]), tonumber(ARGV[5])
local ps, _, _, cid = read_policies(ARGV, 6)
local st, done, till = load(KEYS[2], ps, now, KEYS[3], cid)
local cs = parse_costs(ARGV[2])
local ks = {}
for i = 1, #ps do ks[i] = cs and cs[i] or ps[i].call end
local moved = move_now(st, ps, now, grace, ARGV[1], ks, cid)
local slot, kind = now, moved and 1 or 0
if not moved then
  slot = slot_k(st, ps, now, ks)
  take_at(st, ps, slot, ks, now)
  window_record(st, ps, slot, ks)
end
local value = slot_value(slot, now, cid, st, '')
if not moved and not cs and lo > 0 then
  local taken, tmoved = claim(KEYS[6], KEYS[5], now, lo, hi, '', slot, swap_to(KEYS[6], value, slot, ceil_ms(slot - now + grace)),
    function(v) return move_now(st, ps, now, grace, v, ks, cid) end)
  if taken and tmoved then
    slot, kind, value = now, 2, slot_value(now, now, cid, st, '')
  elseif taken then
    slot, kind, value = slot_of(taken), 2, taken
  end
end
save(KEYS[2], st, ps, now, grace, done, till, KEYS[3])
return {slot - now, kind, room_of(value), now}
