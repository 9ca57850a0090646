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
-- KEYS[1] queue, KEYS[2] state, KEYS[3] config (as in enqueue.lua),
-- KEYS[4] refunds (unused; kept for the key list's shape)
-- ARGV[1] the missed slot's value, "<slot> <room>" (entry.lua; "" when
--         it was given without a room)
-- ARGV[2] the caller's costs, "c1,c2,..." ("" for each policy's call)
-- ARGV[3] grace µs added to the state's TTL
-- ARGV[4..] policies: configuration id, n, then cap, amount, freq µs, call, kind for each
--
-- Reply {delay µs, moved, room}: the new slot is delay from Redis's now
-- (0 when moved); moved is 1 when the caller starts now with the missed
-- slot's tokens; room is the new slot's, for a caller late again.
local now = now_us()
local grace = tonumber(ARGV[3])
local ps, _, _, cid = read_policies(ARGV, 4)
local st, done, till = load(KEYS[2], ps, now, KEYS[3], cid)
local cs = parse_costs(ARGV[2])
local ks = {}
for i = 1, #ps do ks[i] = cs and cs[i] or ps[i].call end
local moved = unused_back(st, ps, now, grace, ARGV[1], ks, cid, now)
local slot = now
if moved then
  -- The bucket just before now held the tokens it kept for this grant.
  for i = 1, #ps do
    if ks[i] > 0 then note_peak(st, i, st[i].level + ks[i], now) end
  end
else
  slot = slot_k(st, ps, now, ks)
  take_at(st, ps, slot, ks, now)
  window_record(st, ps, slot, ks)
end
save(KEYS[2], st, ps, now, grace, done, till, KEYS[3])
local room = string.match(slot_value(slot, now, cid, st, ''), '^%-?%d+ (.*)$')
return {slot - now, moved and 1 or 0, room}
