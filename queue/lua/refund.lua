-- refund.lua: giving back the tokens of a slot its caller came too late
-- for (retime.lua), when that is exact. Needs tokens.lua, state.lua and
-- entry.lua before it.
--
-- Giving the tokens back is exact when the bucket as it would be without
-- that grant never reached its capacity since: the refills it would have
-- kept are the ones it got. The room (entry.lua's slot_value) says what
-- the step that gave the slot left at its instant t0: each policy's level
-- l after it took its grants, and the refunds key then (r0). Since t0 the
-- level rose only by refills and by tokens given back (grants and syncs
-- lower it; a hold delays refills), and the bucket without the grants
-- given back so far is above the bucket as it is by at most what was given
-- back since t0 (r − r0). So the tokens c go back when, for every policy,
--     l + amount × n + (r − r0) + c ≤ cap,
-- where n is the refills in (t0, now]: those of the policy's grid (its
-- anchor, every freq), or at most ⌊(now − t0) / freq⌋ + 1 when the
-- upstream moved the grid since (a hold or a sync: the first field of the
-- refunds key) or it lies ahead; and when the configuration is the one the
-- step ran under, the level now has room for c, and the room is younger
-- than grace (the refunds key outlives it). Otherwise the slot's tokens
-- stay spent.
--
-- Open question: l is the state's level, which counts the tokens promised
-- to slots still ahead as taken at the step, so the bucket may really
-- have held more than this bound counts. A bound on the state's own peaks
-- broke the limit for that reason (docs/design.md, "Overload"), and this
-- one was seen 1 grant over once in 40 runs of the cancel storm test.
--
-- The refunds key: "d,r1,r2,...", the upstream's changes to the refills,
-- then the tokens given back per policy.

-- read_refunds reads the refunds key: its value ('' when missing) and its
-- fields, one more than policies, missing ones 0.
local function read_refunds(key, n)
  local raw = redis.call('GET', key) or ''
  local rs = parse_costs(raw) or {}
  for i = 1, n + 1 do rs[i] = rs[i] or 0 end
  return raw, rs
end

-- give_back gives the tokens ks (one per policy) of the slot whose room is
-- room back to st (loaded under the configuration cid, at now) when that
-- is exact, recording them in rs (read_refunds's fields) and the refunds
-- key. It returns whether it did, and the refunds key's value now.
local function give_back(st, ps, now, grace, room, ks, key, raw_r, rs, cid)
  local t0, id, r0s, ls = string.match(room, '^(%d+) (%S+) ([%d,]+) ([%-%d,]+)$')
  if not t0 or id ~= cid then return false, raw_r end
  t0 = tonumber(t0)
  local l, r0 = parse_costs(ls), parse_costs(r0s)
  if #l ~= #ps or #r0 ~= #ps + 1 or now < t0 or now - t0 > grace or rs[1] < r0[1] then
    return false, raw_r
  end
  local moved = rs[1] ~= r0[1]
  for i = 1, #ps do
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
    -- A rolling window's grant stays logged: spent.
    if p.kind == ROLLING or since < 0 or l[i] + p.amount * n + since + ks[i] > p.cap or s.level + ks[i] > p.cap then
      return false, raw_r
    end
  end
  for i = 1, #ps do
    st[i].level = st[i].level + ks[i]
    rs[i + 1] = rs[i + 1] + ks[i]
  end
  local out = {}
  for i = 1, #rs do out[i] = string.format('%d', rs[i]) end
  raw_r = table.concat(out, ',')
  redis.call('SET', key, raw_r, 'PX', ceil_ms(3 * grace))
  return true, raw_r
end
