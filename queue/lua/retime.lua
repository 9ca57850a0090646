-- retime.lua: a caller that comes too late to use its slot (its process
-- was starved or frozen past MaxLateness) keeps its place: it is given
-- the next slot the bucket has, ahead of every caller still queued, and
-- the tokens of the slot it missed go back to the bucket when that is
-- exact, so a late caller throws nothing away and adds no arrival to the
-- queue. Under overload, where many callers come late, the bucket then
-- keeps granting at its rate instead of spending tokens on slots nobody
-- uses.
--
-- Giving the tokens back is exact when the bucket as it would be without
-- that grant never reached its capacity since: the refills it would have
-- kept are the ones it got. The room (entry.lua's slot_value) says what
-- the step that gave the missed slot left at its instant t0: each policy's
-- level l after it took its grants, and the refunds key then (r0). Since
-- t0 the level rose only by refills and by tokens given back (grants and
-- syncs lower it; a hold delays refills), and the bucket without the grants
-- given back so far is above the bucket as it is by at most what was given
-- back since t0 (r − r0). So the tokens c go back when, for every policy,
--     l + amount × n + (r − r0) + c ≤ cap,
-- where n is the refills in (t0, now]: those of the policy's grid (its
-- anchor, every freq), or at most ⌊(now − t0) / freq⌋ + 1 when the
-- upstream moved the grid since (a hold or a sync: the first field of the
-- refunds key) or it lies ahead; and when the configuration is the one the
-- step ran under, the level now has room for c, and the room is younger
-- than grace (the refunds key outlives it). Otherwise the missed slot's
-- tokens stay spent (never an excess) and the caller still takes the next
-- slot.
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
local raw_r = redis.call('GET', KEYS[4]) or ''
local rs = parse_costs(raw_r) or {}
for i = 1, #ps + 1 do rs[i] = rs[i] or 0 end

local refunded = 0
local t0, id, r0s, ls = string.match(ARGV[1], '^(%d+) (%S+) ([%d,]+) ([%-%d,]+)$')
if t0 and id == cid then
  t0 = tonumber(t0)
  local l, r0 = parse_costs(ls), parse_costs(r0s)
  local ok = #l == #ps and #r0 == #ps + 1 and now >= t0 and now - t0 <= grace and rs[1] >= r0[1]
  local moved = rs[1] ~= r0[1]
  for i = 1, #ps do
    if ok then
      local p, s = ps[i], st[i]
      local n
      if moved or s.anchor > now then
        n = math.floor((now - t0) / p.freq) + 1
      elseif s.anchor > t0 then
        n = math.ceil((s.anchor - t0) / p.freq)
      else
        n = 0
      end
      local since = rs[i + 1] - r0[i + 1]
      -- A rolling window's missed grant stays logged: spent.
      if p.kind == ROLLING or since < 0 or l[i] + p.amount * n + since + ks[i] > p.cap or s.level + ks[i] > p.cap then
        ok = false
      end
    end
  end
  if ok then
    for i = 1, #ps do
      st[i].level = st[i].level + ks[i]
      rs[i + 1] = rs[i + 1] + ks[i]
    end
    refunded = 1
    local out = {}
    for i = 1, #rs do out[i] = string.format('%d', rs[i]) end
    raw_r = table.concat(out, ',')
    redis.call('SET', KEYS[4], raw_r, 'PX', ceil_ms(3 * grace))
  end
end
local slot = slot_k(st, ps, now, ks)
take_at(st, ps, slot, ks, now)
window_record(st, ps, slot, ks)
save(KEYS[2], st, ps, now, grace, done, till, KEYS[3])
local room = string.match(slot_value(slot, now, cid, st, raw_r), '^%-?%d+ (.*)$')
return {slot - now, refunded, room}
