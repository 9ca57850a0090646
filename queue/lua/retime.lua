-- retime.lua: a caller that comes too late to use its slot (its process
-- was starved or frozen past MaxLateness) keeps its place: it is given
-- the next slot the bucket has, ahead of every caller still queued, and
-- the tokens of the slot it missed go back to the bucket when that is
-- exact, so a late caller throws nothing away and adds no arrival to the
-- queue. Under overload, where many callers come late, the bucket then
-- keeps granting at its rate instead of spending tokens on slots nobody
-- uses.
--
-- Giving the tokens back, and when that is exact: refund.lua.
--
-- KEYS[1] queue, KEYS[2] state, KEYS[3] config (as in enqueue.lua),
-- KEYS[4] refunds: "d,r1,r2,...", the upstream's changes to the refills,
-- then the tokens given back per policy
-- ARGV[1] room ("" when the missed slot was given without one)
-- ARGV[2] the caller's costs, "c1,c2,..." ("" for each policy's call)
-- ARGV[3] grace µs added to the state's TTL
-- ARGV[4..] policies: configuration id, n, then cap, amount, freq µs, call, kind for each
--
-- Reply {delay µs, refunded, room}: the new slot is delay from Redis's
-- now; refunded is 1 when the missed slot's tokens went back; room is the
-- new slot's, for a caller late again.
local now = now_us()
local grace = tonumber(ARGV[3])
local ps, _, _, cid = read_policies(ARGV, 4)
local st, done, till = load(KEYS[2], ps, now, KEYS[3], cid)
local cs = parse_costs(ARGV[2])
local ks = {}
for i = 1, #ps do ks[i] = cs and cs[i] or ps[i].call end
local raw_r, rs = read_refunds(KEYS[4], #ps)
local ok
ok, raw_r = give_back(st, ps, now, grace, ARGV[1], ks, KEYS[4], raw_r, rs, cid)
local refunded = ok and 1 or 0
local slot = slot_k(st, ps, now, ks)
take_at(st, ps, slot, ks, now)
window_record(st, ps, slot, ks)
save(KEYS[2], st, ps, now, grace, done, till, KEYS[3])
local room = string.match(slot_value(slot, now, cid, st, raw_r), '^%-?%d+ (.*)$')
return {slot - now, refunded, room}
