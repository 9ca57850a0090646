-- estimate.lua: if a caller of these costs entered now, when would its
-- slot be, and behind how many callers? It changes nothing. The answer is
-- enqueue.lua's for the same caller: the slot is exact unless callers
-- ahead leave (earlier) or the caller is refused (MaxQueue, MaxWait), or,
-- with named lanes, the lanes' callers still to come change its share.
--
-- KEYS[1] queue, KEYS[2] state, KEYS[3] config (as in enqueue.lua),
-- KEYS[4..7] the lanes' keys (as in enqueue.lua)
-- ARGV[1..] policies: configuration id, n, then cap, amount, freq µs, call, kind for each
-- ARGV[after policies] the caller's costs, "c1,c2,..." or "" (entry.lua),
--         then its lane, as its ID would end ("#<weight>,<priority>,<lane>",
--         lanes.lua), or "" for the default lane
--
-- Reply {now µs, delay µs until the slot, callers ahead}.
local now = now_us()
local ps, i, _, id = read_policies(ARGV, 1)
local costs = parse_costs(ARGV[i])
local st = load(KEYS[2], ps, now, KEYS[3], id)
local lk = {queue = KEYS[1], prefix = KEYS[4], classes = KEYS[5], class = KEYS[6], tags = KEYS[7]}
local lane, _, p = lane_of(ARGV[i + 1] or '')
local dlen = redis.call('LLEN', KEYS[1])
local qlen = lane == '' and dlen or redis.call('LLEN', lane_list(lk, lane))
local on = lanes_on(lk)
if dlen == 0 and not on then -- as enqueue.lua: nobody queued, no extras
  for k = 1, #ps do st[k].extra = 0 end
end
local ahead = qlen
if on then ahead = (qlen + 1) * lane_count(lk, lane, p, dlen) - 1 end
local slot = slot_k(st, ps, now, ahead_k(st, ps, ahead, costs))
return {now, slot - now, qlen}
