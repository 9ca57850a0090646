-- peaks.lua: the peaks, the part of a bucket's state string (state.lua,
-- which appends this file after its own text for Script: StateLua) that
-- says how high each policy's level was before the grants of recent
-- slots. Needs tokens.lua before it. Its Go twin only carries the token
-- (BucketState.Peaks in state.go): only the scripts read it.
--
-- Peaks. The tokens of a slot its caller did not use at its instant (it
-- came too late, or left) may serve it later, or go back to the bucket
-- (refund.lua), when that is exact: when the bucket would have lost no
-- refill to its capacity had they stayed in it from the grant on, that
-- is when each policy's level over that span stayed at least those tokens
-- below its capacity. Between two grants a policy's level only rises
-- (refills; feedback.lua's syncs and holds only lower it), so its highest
-- over a span is its level just before one of the grants in it, or at its
-- end. take_at notes that level at every grant (note_peak): the state
-- refilled to the slot, which is the level the bucket will hold there
-- when the slot comes after the grants already promised (slot_k); when it
-- comes before some (tokens back made room), the entry it joins takes the
-- levels of theirs (peaks_update).
--
-- The peaks token is "p<floor>" then up to PEAK_ENTRIES entries
-- "/<t>:<v1>,...,<vn>", in time order: vi is at least policy i's level
-- just before every grant taking from it whose slot is after the
-- previous entry's t and at most t (0: none). Every grant with a slot
-- from floor on is counted. Tokens a caller did not use at its slot that
-- stayed in the bucket raise, from its grant on, the entries whose grants
-- they were there for (peaks_raise). So policy i's highest level over the
-- grants from t0 on is at most the highest vi of the entries with t >= t0
-- (peak_since), when t0 >= floor.
local PEAK_ENTRIES = 8

-- peaks_parse reads a peaks token for n policies (nil: none, or not one).
local function peaks_parse(tok, n)
  local f = tok and tonumber((string.match(tok, '^p(%-?%d+)'))) -- one value: entry.lua's slot_of
  if not f then return nil end
  local pk = {floor = f}
  for t, vs in string.gmatch(tok, '/(%-?%d+):([%-%d,]+)') do
    local e = {tonumber(t)}
    for v in string.gmatch(vs, '[^,]+') do e[#e + 1] = tonumber(v) end
    if #e ~= n + 1 then return nil end
    pk[#pk + 1] = e
  end
  return pk
end

-- peaks_string formats the peaks pk.
local function peaks_string(pk)
  local out = {'p' .. int(pk.floor)}
  for j = 1, #pk do
    local e, vs = pk[j], {}
    for i = 2, #e do vs[i - 1] = int(e[i]) end
    out[j + 1] = '/' .. int(e[1]) .. ':' .. table.concat(vs, ',')
  end
  return table.concat(out)
end

-- promised_until is when the tokens every policy (but rolling windows,
-- whose grants never go back) promised to slots ahead are due: no grant
-- of theirs comes after it.
local function promised_until(st, ps, now)
  local t = math.max(now, st.hold or 0)
  for i = 1, #ps do
    local p, s = ps[i], st[i]
    if p.kind ~= ROLLING and s.level < 0 then
      t = math.max(t, s.anchor + math.ceil(-s.level / p.amount) * p.freq)
    end
  end
  return t
end

-- peaks_update brings the peaks up to now before a save: a state without
-- them (written by an earlier version, or by a change of policies) starts
-- them from the last slot promised, since the grants before it were not
-- counted; the highest levels this script noted (note_peak) join as an
-- entry at the latest slot it gave; an entry no higher than the next
-- goes. So the entries' levels decrease with time: at saturation (about
-- the same level before every grant) one or two are left, the oldest the
-- highest, left by a burst or an idle spell. The oldest goes, and the
-- floor moves to it, when it is older than grace (no give-back is judged
-- from before it: refund.lua). Past PEAK_ENTRIES, the two neighbours
-- closest in level merge. (Merging the oldest two instead would carry the
-- highest level forward, one entry a script: a bucket full once would
-- never give back again; dropping the oldest would move the floor past
-- most late callers' grants.)
local function peaks_update(st, ps, now, grace)
  local pk = st.pk
  if not pk then
    pk = {floor = promised_until(st, ps, now)}
    st.pk = pk
  end
  if st.pv then
    local e = {st.pt}
    for i = 1, #ps do e[i + 1] = math.min(ps[i].cap, st.pv[i] or 0) end
    st.pv, st.pt = nil, nil
    -- In time order; an entry put before a later one takes over part of
    -- that one's grants, so it takes its levels too.
    local at = #pk + 1
    while at > 1 and pk[at - 1][1] >= e[1] do at = at - 1 end
    local b = pk[at]
    if b then
      for i = 2, #e do e[i] = math.max(e[i], b[i]) end
    end
    if b and b[1] == e[1] then pk[at] = e else table.insert(pk, at, e) end
  end
  -- An entry no higher than the next one goes: the next counts its
  -- grants too, and the peaks from any t0 on stay the same.
  local j = #pk - 1
  while j >= 1 do
    local o, n, below = pk[j], pk[j + 1], true
    for i = 2, #o do
      if o[i] > n[i] then below = false end
    end
    if below then table.remove(pk, j) end
    j = math.min(j - 1, #pk - 1)
  end
  while #pk > 0 and pk[1][1] < now - grace do
    pk.floor = math.max(pk.floor, pk[1][1])
    table.remove(pk, 1)
  end
  -- Past PEAK_ENTRIES, the two neighbours closest in level merge (the
  -- later takes the higher levels): the peaks from a t0 between them
  -- count that much more.
  while #pk > PEAK_ENTRIES do
    local best, at = math.huge, 1
    for k = 1, #pk - 1 do
      local d = 0
      for i = 2, #pk[k] do d = math.max(d, (pk[k][i] - pk[k + 1][i]) / ps[i - 1].cap) end
      if d < best then best, at = d, k end
    end
    local a, b = pk[at], pk[at + 1]
    for i = 2, #b do b[i] = math.max(a[i], b[i]) end
    table.remove(pk, at)
  end
end

-- peak_since is the highest level policy i can have held just before the
-- grants from t0 on, by the peaks, or nil when they do not reach back to
-- t0. With upto, only the grants up to it count, and the level then:
-- entry j counts the grants after entry j-1's time, so the entries that
-- count are those from t0 on up to the first past upto.
local function peak_since(st, i, t0, upto)
  local pk = st.pk
  if not pk or t0 < pk.floor then return nil end
  local h = 0
  for j = 1, #pk do
    if upto and j > 1 and pk[j - 1][1] >= upto then break end
    if pk[j][1] >= t0 and pk[j][i + 1] > h then h = pk[j][i + 1] end
  end
  if st.pv and st.pv[i] and st.pv[i] > h then h = st.pv[i] end
  return h
end

-- peaks_raise raises the peaks from t0 on by ks (one per policy): tokens
-- given back at t0 raise the bucket's levels from then on. With upto,
-- only until then (a grant moved from t0 to upto): an entry whose grants
-- run past upto is split there first, its level bounding both parts.
local function peaks_raise(st, ps, t0, ks, upto)
  local pk = st.pk
  if not pk then return end
  for j = 1, #pk do
    local e = pk[j]
    if upto and j > 1 and pk[j - 1][1] >= upto then break end
    if upto and e[1] > upto then
      local part = {upto}
      for i = 2, #e do part[i] = e[i] end
      table.insert(pk, j, part)
      e = part
    end
    if e[1] >= t0 then
      for i = 1, #ps do e[i + 1] = math.min(ps[i].cap, e[i + 1] + ks[i]) end
    end
    if upto and e[1] >= upto then break end
  end
  if st.pv then
    for i = 1, #ps do
      if st.pv[i] then st.pv[i] = st.pv[i] + ks[i] end
    end
  end
end
