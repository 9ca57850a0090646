-- state.lua: the state string of a bucket (its Go twin, which builds and
-- parses the same string, is state.go), and the check of the configuration
-- in force (config.go). Needs tokens.lua before it.
--
-- The state key is one string of fields separated by spaces: "done until
-- l1 a1 ... ln an format id hold held [costed x1 ... xn]". done counts the tickets no
-- longer in the queue (granted at once, popped by the scheduler, or
-- cancelled while queued), so a caller pushed to position p of the queue
-- has ticket done + p; until is the Redis instant (µs) to which the last
-- step renewed the scheduler lock, 0 once released; then level and anchor
-- of each policy; then the format version (FORMAT) and the id of the
-- configuration the levels were written under (config.go: the config key
-- holds "<format> <id> <json>"); then the hold: until when (µs, 0: none)
-- no slot comes that takes from the held policies (held: a bitmask of
-- policy indexes, bit 0 the first; 0 means every policy), written by
-- feedback.lua; then, only while callers with costs of
-- their own are queued, how many and each policy's extra: the tokens the
-- queued callers need beyond call each (written by whoever queues, pops or
-- removes such a caller; absent means none and all 0); then the peaks
-- (peaks.lua; costed and the extras are then written, 0 when no
-- caller with costs is queued, so that the peaks are never read as
-- them). Earlier versions of the scripts read such a state and drop the
-- peaks when they write it.
--
-- Upgrades: format 1 had no id ("... an 1 [costed x1 ...]"), format 0 no
-- version either. Such a state is read as what it is and written back in
-- this format by the next script that saves it, atomically, once the
-- config key names this process's configuration. A later format is
-- refused, as is a config key of a later format.

local FORMAT = 2

-- CONFIG_TTL_MS is the config key's lifetime (config.go's ConfigTTL), renewed
-- whenever a script reads the key, and by the save that counts every 64th
-- ticket done (a PEXPIRE on every save cost the scripts that save a
-- fifth more Redis time): the limit outlives any idle spell of the bucket
-- shorter than that, and a bucket in steady use renews it every 64 grants.
local CONFIG_RENEW_EVERY = 64

-- FRESH_LAG_US bounds how late a new bucket's refills start (load):
-- tokens.lua's REFILL_LAG_US.
local FRESH_LAG_US = REFILL_LAG_US
local CONFIG_TTL_MS = 2592000000

-- check_format refuses a state of a format this code does not know.
local function check_format(v)
  if v and v > FORMAT then
    error('sluice: the bucket state has format ' .. v .. ', this process knows up to ' .. FORMAT .. ': upgrade it', 0)
  end
end

-- config_check is called when the state does not carry id, the
-- configuration this process runs under: the state is missing, of an older
-- format, or was written under another configuration. The config key
-- decides: missing, the script fails with "SLUICE_CONFIG unset" (the
-- process stores its configuration there, if still missing, and runs the
-- script again); naming another configuration, with "SLUICE_CONFIG
-- <its id>" (the process adopts it, or fails with ErrConfigMismatch).
-- Nothing was written before either error. Both are raised as strings
-- (level 0: no position), which real Redis and miniredis both pass on
-- (scriptreply.Raised reads either); miniredis turns a raised table into
-- "table: 0x...".
local function config_check(config_key, id)
  local raw = redis.call('GET', config_key)
  if not raw then
    error('SLUICE_CONFIG unset', 0)
  end
  local f, cid = string.match(raw, '^(%d+) (%S+)')
  f = tonumber(f)
  if not f or f > FORMAT then
    error('sluice: the bucket config has format ' .. tostring(f) .. ', this process knows up to ' .. FORMAT .. ': upgrade it', 0)
  end
  if cid ~= id then
    error('SLUICE_CONFIG ' .. cid, 0)
  end
  redis.call('PEXPIRE', config_key, CONFIG_TTL_MS)
end

-- stale_state refuses a state written under another configuration than the
-- one the config key names: only a live change writes both, together.
local function stale_state(sid, id)
  if not sid or sid == '' then
    error('sluice: the bucket state has format ' .. FORMAT .. ' but no configuration id', 0)
  end
  error('sluice: the bucket state was written under configuration ' .. sid .. ' but ' .. id .. ' is in force', 0)
end
-- A string costs one GET and one SET ... PX, where a hash would need
-- HMGET, HSET and PEXPIRE: this is on every caller's path. Because a
-- queued arrival changes none of it, a queued enqueue writes nothing here.

-- load reads and refills every policy's state under the configuration id
-- (its policies ps; config_key is where the one in force is named), and
-- returns it with done, until, whether the state key was missing, and the
-- string as stored when it is of this format (nil when missing or of an
-- older one): see save_extras. The state table carries id, for save.
local function load(state_key, ps, now, config_key, id)
  if ps.rolling > 0 then
    LOG_BASE = string.sub(state_key, 1, -6) .. 'window:' -- "<base>state"
  end
  local raw = redis.call('GET', state_key)
  local st = {id = id, done0 = 0, hold = 0, held = 0}
  if not raw then
    config_check(config_key, id)
    -- A new bucket is full, and its refills start a little late: half a
    -- period, at most 5 ms (FRESH_LAG_US). An upstream that counts from
    -- the first request it receives starts its own refills when that
    -- request arrives, after this grant; lagging its grid keeps the
    -- requests after the first burst from arriving a jitter ahead of the
    -- upstream's refills (the one 429 the upstream scenario found at the
    -- exact limit). It costs at most 5 ms of one refill, once.
    for i = 1, #ps do
      local p = ps[i]
      local lag = math.min(math.floor(p.freq / 2), FRESH_LAG_US)
      if p.kind == FIXED then
        -- The window now in progress, on the grid of whole windows.
        st[i] = {level = p.cap, anchor = lag + math.floor((now - lag) / p.freq) * p.freq, extra = 0}
      elseif p.kind == ROLLING then
        st[i] = {level = p.cap, anchor = 0, extra = 0, log = {}, skip = 0, log_end = true}
        redis.call('DEL', log_key(i)) -- a log the state outlived
      else
        st[i] = {level = p.cap, anchor = now + lag, extra = 0}
      end
    end
    st.costed = 0
    st.pk = {floor = now} -- nothing promised yet
    return st, 0, 0, true, nil
  end
  if #ps == 1 and ps.rolling == 0 then -- the common case, without a loop or a table of values
    local p = ps[1]
    local done, till, l, a, v, sid, h, m, c, x, pk = string.match(raw, '^(%S+) (%S+) (%S+) (%S+) ?(%S*) ?(%S*) ?(%S*) ?(%S*) ?(%S*) ?(%S*) ?(%S*)')
    if sid ~= id then
      config_check(config_key, id)
      v = tonumber(v)
      check_format(v)
      if v == FORMAT then stale_state(sid, id) end
      c, x, h, m, raw, pk = sid, h, 0, 0, nil, nil -- format 1 or 0: no id, no hold, no peaks
    end
    st.pk = peaks_parse(pk, 1)
    local level, anchor = refill(tonumber(l), tonumber(a), now, p.cap, p.amount, p.freq)
    st[1] = {level = level, anchor = anchor, extra = tonumber(x) or 0}
    st.costed = tonumber(c) or 0
    st.done0 = tonumber(done) or 0
    h = tonumber(h) or 0
    if h > now then st.hold, st.held = h, tonumber(m) or 0 end
    return st, st.done0, tonumber(till) or 0, false, raw
  end
  local vals = {}
  for v in string.gmatch(raw, '%S+') do
    vals[#vals + 1] = v
  end
  local n = #ps
  local at = 2 * n + 6 -- where costed and the extras start, after the id and the hold
  if vals[2 * n + 4] ~= id then
    config_check(config_key, id)
    local v = tonumber(vals[2 * n + 3])
    check_format(v)
    if v == FORMAT then stale_state(vals[2 * n + 4], id) end
    at, raw = 2 * n + 3, nil
  else
    local h = tonumber(vals[2 * n + 5]) or 0
    if h > now then st.hold, st.held = h, tonumber(vals[2 * n + 6]) or 0 end
  end
  if raw then st.pk = peaks_parse(vals[at + n + 2], n) end
  for i = 1, n do
    local p = ps[i]
    if p.kind == ROLLING then
      st[i] = {level = tonumber(vals[2 * i + 1]), anchor = tonumber(vals[2 * i + 2]), extra = tonumber(vals[at + 1 + i]) or 0}
      window_refill(st[i], p, i, now)
    else
      local level, anchor = refill(tonumber(vals[2 * i + 1]), tonumber(vals[2 * i + 2]), now, p.cap, p.amount, p.freq)
      st[i] = {level = level, anchor = anchor, extra = tonumber(vals[at + 1 + i]) or 0}
    end
  end
  st.costed = tonumber(vals[at + 1]) or 0
  st.done0 = tonumber(vals[1]) or 0
  return st, st.done0, tonumber(vals[2]) or 0, false, raw
end

-- full_in is how long, from now, until every policy is full again: the state
-- key must live at least that long, or a bucket that expired early would
-- come back full too soon and over-admit.
local function full_in(st, ps, now)
  local d = 0
  for i = 1, #ps do
    local p, s = ps[i], st[i]
    if s.level < p.cap then
      local t
      if p.kind == ROLLING then
        t = s.anchor + window_span(p) + 1 - now -- the last entry logged expires
      else
        t = s.anchor + math.ceil((p.cap - s.level) / p.amount) * p.freq - now
      end
      if t > d then d = t end
    end
  end
  return d
end

-- extras_string is " costed x1 ... xn", all 0 when no caller with costs
-- is queued.
local function extras_string(st)
  local x = (st.costed or 0) > 0
  local parts = {x and st.costed or 0}
  for i = 1, #st do
    parts[i + 1] = x and st[i].extra or 0
  end
  return string.format(string.rep(' %d', #parts), unpack(parts))
end

-- save writes done, until and every policy's state, the format and the
-- configuration's id, the callers with costs and the extras, and the
-- peaks (peaks_update), with a TTL that
-- outlives the time to full by grace, and renews the config key's TTL
-- (config_key, which names st.id) when done passed a multiple of
-- CONFIG_RENEW_EVERY since load (st.done0; always for a state load did not
-- read).
local function save(state_key, st, ps, now, grace, done, till, config_key)
  local value
  peaks_update(st, ps, now, grace)
  if #st == 1 then
    local s = st[1]
    value = string.format('%d %d %d %d %d %s %d %d %d %d ', done, till, s.level, s.anchor, FORMAT, st.id, st.hold or 0, st.held or 0,
      st.costed or 0, (st.costed or 0) > 0 and s.extra or 0) .. peaks_string(st.pk)
  else
    -- One string.format for every number: far cheaper than one each.
    local parts = {done, till}
    for i = 1, #st do
      parts[#parts + 1] = st[i].level
      parts[#parts + 1] = st[i].anchor
    end
    parts[#parts + 1] = FORMAT
    local n = #parts
    parts[n + 1], parts[n + 2], parts[n + 3] = st.id, st.hold or 0, st.held or 0
    value = string.format(string.rep('%d ', n) .. '%s %d %d', unpack(parts)) .. extras_string(st) .. ' ' .. peaks_string(st.pk)
  end
  redis.call('SET', state_key, value, 'PX', ceil_ms(full_in(st, ps, now) + grace))
  if (ps.rolling or 0) > 0 then
    for i = 1, #ps do
      if (st[i].skip or 0) > 0 then -- the entries window_refill counted back
        redis.call('LTRIM', log_key(i), st[i].skip, -1)
        st[i].skip = 0
      end
      local pend = st[i].pend
      if pend and #pend > 0 then
        local out = {}
        for k = 1, #pend do out[k] = string.format('%d %d', pend[k][1], pend[k][2]) end
        redis.call('RPUSH', log_key(i), unpack(out))
        redis.call('PEXPIRE', log_key(i), ceil_ms(st[i].anchor + window_span(ps[i]) + 1 - now + grace))
        st[i].pend = nil
      end
    end
  end
  if math.floor(done / CONFIG_RENEW_EVERY) ~= math.floor((st.done0 or -1) / CONFIG_RENEW_EVERY) then
    redis.call('PEXPIRE', config_key, CONFIG_TTL_MS)
  end
end

-- save_extras writes a state whose levels, done and until did not change
-- since load (a caller with costs queued): raw, the string load read, up to
-- its hold, then the callers with costs and each policy's extra and the
-- peaks as loaded, keeping the TTL. Levels as stored, before load refilled them, are
-- as good as refilled ones: refill brings them to the same values at any
-- later instant.
local function save_extras(state_key, raw, st)
  local value = string.match(raw, '^' .. string.rep('%S+ ', 2 * #st + 5) .. '%S+')
  if st.pk then
    value = value .. extras_string(st) .. ' ' .. peaks_string(st.pk) -- as loaded: no level changed
  elseif (st.costed or 0) > 0 then
    value = value .. extras_string(st)
  end
  redis.call('SET', state_key, value, 'KEEPTTL')
end

-- add_done counts n more tickets as no longer queued (callers that left the
-- queue) and, when less is set, takes less.costed callers with costs and
-- their extra tokens (less[i] per policy) off the state's, keeping the rest
-- of the state and its TTL. With less, the state must be of the
-- configuration id (config_key: see load), or of an older format.
local function add_done(state_key, n, less, config_key, id)
  local raw = redis.call('GET', state_key)
  if not raw then return end
  if not less then
    local done, rest = string.match(raw, '^(%d+)(.*)$')
    if done then
      redis.call('SET', state_key, string.format('%d', tonumber(done) + n) .. rest, 'KEEPTTL')
    end
    return
  end
  local vals = {}
  for v in string.gmatch(raw, '%S+') do
    vals[#vals + 1] = v
  end
  local np = #less
  if #vals < 2 + 2 * np then return end
  local at = 2 * np + 6 -- where costed starts, after the id and the hold
  local hold, held = vals[2 * np + 5] or '0', vals[2 * np + 6] or '0'
  if vals[2 * np + 4] ~= id then
    config_check(config_key, id)
    local v = tonumber(vals[2 * np + 3])
    check_format(v)
    if v == FORMAT then stale_state(vals[2 * np + 4], id) end
    at, hold, held = 2 * np + 3, '0', '0'
  end
  local parts = {int(tonumber(vals[1]) + n)}
  for i = 2, 2 + 2 * np do
    parts[i] = vals[i]
  end
  parts[3 + 2 * np] = int(FORMAT)
  parts[4 + 2 * np] = id
  parts[5 + 2 * np] = hold
  parts[6 + 2 * np] = held
  local costed = (tonumber(vals[at + 1]) or 0) - less.costed
  -- The peaks of this format, kept as they are (no level changed).
  local pk = at == 2 * np + 6 and vals[at + np + 2]
  if pk and string.sub(pk, 1, 1) ~= 'p' then pk = nil end
  if costed > 0 or pk then
    parts[7 + 2 * np] = int(math.max(costed, 0))
    for i = 1, np do
      parts[7 + 2 * np + i] = costed > 0 and int((tonumber(vals[at + 1 + i]) or 0) - less[i]) or '0'
    end
  end
  if pk then parts[#parts + 1] = pk end
  redis.call('SET', state_key, table.concat(parts, ' '), 'KEEPTTL')
end
