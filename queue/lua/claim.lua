-- claim.lua: the direct poll's claim (Queue.Poll). A caller of the
-- bucket's own costs whose direct poll found its slot ahead, when the due
-- set showed a slot whose caller did not come for it, claims that slot in
-- exchange for its own (internal/protocol/claim.lua), as poll.lua does.
--
-- KEYS[1] state, KEYS[2] config (as in enqueue.lua), KEYS[3] slot key
-- prefix, KEYS[4] due
-- ARGV[1] the caller's entry
-- ARGV[2] its slot key's value, which its direct poll read and deleted
-- ARGV[3], ARGV[4] the claim window, µs back from now: lo, hi
-- ARGV[5] grace µs: the slot key given in exchange outlives its slot by this
-- ARGV[6..] policies: configuration id, n, then cap, amount, freq µs, call, kind for each
--
-- Reply: poll.lua's for a claim, {5, delay µs, 0, 0, slot, room}, or {1,
-- now µs} when there was none to claim: the caller keeps its own slot.
local now = now_us()
local v = ARGV[2]
local slot = slot_of(v)
local lo, hi, grace = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local c = slot and claim_for(KEYS[1], KEYS[2], KEYS[3], KEYS[4], now, lo, hi, grace, ARGV, 6, ARGV[1], slot, swap_to(KEYS[4], v, slot, ceil_ms(slot - now + grace)))
return c or {1, now}
