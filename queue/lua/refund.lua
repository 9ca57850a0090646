-- refund.lua: giving back the tokens of a slot nobody will use (a caller
-- too late for it, retime.lua, or one that left after it was written,
-- cancel.lua), when that is exact. Needs tokens.lua, state.lua and
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
-- stay spent: never an excess.
--
-- That bound counts every refill since t0 as if no grant had taken it: at
-- saturation, where the refills are all granted, it fails as soon as the
-- caller is later than (cap − l) / rate. So when the state's peaks
-- (state.lua) reach back to t0, and the upstream did not move the grid
-- since, the tokens go back on the levels the bucket really had: when for
-- every policy
--     (highest level since t0) + c ≤ cap,
-- the bucket without the grant stayed c above the bucket as it was, never
-- at its capacity, and lost no refill the bucket as it was kept. The
-- highest level counts the tokens given back since (they raised it), so
-- r − r0 is not added again.
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

-- peak_since is the highest level policy i of st can have had from t0 to
-- now by the state's peaks, or nil when they do not reach back to t0.
local function peak_since(st, i, t0)
  local s = st[i]
  if not st.e1 or not s.p1 then return nil end
  local h = math.max(s.p1, s.hi or s.level, s.level)
  if t0 >= st.e1 then return h end
  if t0 >= st.e0 then return math.max(h, s.p0) end
  return nil
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
  -- Either bound suffices: by the peaks (tight, when they reach back to
  -- t0) or by the refills since t0 (always available, looser).
  local by_peaks, by_refills = not moved, true
  for i = 1, #ps do
    local p, s = ps[i], st[i]
    if p.kind == ROLLING then
      return false, raw_r -- a rolling window's grant stays logged: spent
    end
    local top = by_peaks and peak_since(st, i, t0)
    if not top or top + ks[i] > p.cap then by_peaks = false end
    local n
    if moved or s.anchor > now then
      n = math.floor((now - t0) / p.freq) + 1
    elseif s.anchor > t0 then
      n = math.ceil((s.anchor - t0) / p.freq)
    else
      n = 0
    end
    local since = rs[i + 1] - r0[i + 1]
    if since < 0 or l[i] + p.amount * n + since + ks[i] > p.cap or s.level + ks[i] > p.cap then
      by_refills = false
    end
  end
  if not (by_peaks or by_refills) then return false, raw_r end
  for i = 1, #ps do
    local s = st[i]
    s.level = s.level + ks[i]
    s.hi = math.max(s.hi or s.level, s.level) -- a peak for the grants judged after
    rs[i + 1] = rs[i + 1] + ks[i]
  end
  local out = {}
  for i = 1, #rs do out[i] = string.format('%d', rs[i]) end
  raw_r = table.concat(out, ',')
  redis.call('SET', key, raw_r, 'PX', ceil_ms(3 * grace))
  return true, raw_r
end
