-- estimate.lua: if a caller of these costs entered now, when would its
-- slot be, and behind how many callers? It changes nothing. The answer is
-- enqueue.lua's for the same caller: the slot is exact unless callers
-- ahead leave (earlier) or the caller is refused (MaxQueue, MaxWait).
--
-- KEYS[1] queue, KEYS[2] state, KEYS[3] config (as in enqueue.lua)
-- ARGV[1..] policies: configuration id, n, then cap, amount, freq µs, call, kind for each
-- ARGV[after policies] the caller's costs, "c1,c2,..." or "" (entry.lua)
--
-- Reply {now µs, delay µs until the slot, callers ahead}.
local now = now_us()
local ps, i, _, id = read_policies(ARGV, 1)
local costs = parse_costs(ARGV[i])
local st = load(KEYS[2], ps, now, KEYS[3], id)
local qlen = redis.call('LLEN', KEYS[1])
if qlen == 0 then -- as enqueue.lua: nobody queued, no extras
  for k = 1, #ps do st[k].extra = 0 end
end
local slot = slot_k(st, ps, now, ahead_k(st, ps, qlen, costs))
return {now, slot - now, qlen}
