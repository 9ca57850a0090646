-- state.lua: the state string of a bucket (its Go twin, which builds and
-- parses the same string, is state.go). Needs tokens.lua before it.
--
-- The state key is one string of integers separated by spaces: "done
-- until l1 a1 l2 a2 ...". done counts the tickets no longer in the queue
-- (granted at once, popped by the scheduler, or cancelled while queued),
-- so a caller pushed to position p of the queue has ticket done + p;
-- until is the Redis instant (µs) to which the last step renewed the
-- scheduler lock, 0 once released; then level and anchor of each policy;
-- then the format version (FORMAT: a state of a later format is refused,
-- one without it is of this layout); then, only while callers with costs
-- of their own are queued, how many and each policy's extra: the tokens
-- the queued callers need beyond call each (written by whoever queues,
-- pops or removes such a caller; absent means none and all 0). Readers of
-- the layout before the version ignore everything after the levels.

local FORMAT = 1

-- check_format refuses a state of a format this code does not know.
local function check_format(v)
  if v and v > FORMAT then
    error('sluice: the bucket state has format ' .. v .. ', this process knows up to ' .. FORMAT .. ': upgrade it', 0)
  end
end
-- A string costs one GET and one SET ... PX, where a hash would need
-- HMGET, HSET and PEXPIRE: this is on every caller's path. Because a
-- queued arrival changes none of it, a queued enqueue writes nothing here.

-- load reads and refills every policy's state, and returns it with done,
-- until, whether the state key was missing, and the string as stored when
-- it has a format version (nil when missing or of the layout before the
-- version): see save_extras.
local function load(state_key, ps, now)
  local raw = redis.call('GET', state_key)
  local st = {}
  if #ps == 1 then -- the common case, without a loop or a table of values
    local p = ps[1]
    local done, till, l, a, v, c, x
    if raw then
      done, till, l, a, v, c, x = string.match(raw, '^(%S+) (%S+) (%S+) (%S+) ?(%S*) ?(%S*) ?(%S*)')
      check_format(tonumber(v))
    end
    local level, anchor = refill(tonumber(l), tonumber(a), now, p.cap, p.amount, p.freq)
    st[1] = {level = level, anchor = anchor, extra = tonumber(x) or 0}
    st.costed = tonumber(c) or 0
    return st, tonumber(done) or 0, tonumber(till) or 0, not raw, v ~= '' and raw or nil
  end
  local vals = {}
  if raw then
    for v in string.gmatch(raw, '%S+') do
      vals[#vals + 1] = tonumber(v)
    end
  end
  check_format(vals[2 * #ps + 3])
  for i = 1, #ps do
    local p = ps[i]
    local level, anchor = refill(vals[2 * i + 1], vals[2 * i + 2], now, p.cap, p.amount, p.freq)
    st[i] = {level = level, anchor = anchor, extra = vals[2 * #ps + 4 + i] or 0}
  end
  st.costed = vals[2 * #ps + 4] or 0
  return st, vals[1] or 0, vals[2] or 0, not raw, vals[2 * #ps + 3] and raw or nil
end

-- full_in is how long, from now, until every policy is full again: the state
-- key must live at least that long, or a bucket that expired early would
-- come back full too soon and over-admit.
local function full_in(st, ps, now)
  local d = 0
  for i = 1, #ps do
    local p, s = ps[i], st[i]
    if s.level < p.cap then
      local t = s.anchor + math.ceil((p.cap - s.level) / p.amount) * p.freq - now
      if t > d then d = t end
    end
  end
  return d
end

-- save writes done, until and every policy's state (and extras, when
-- there are any), with a TTL that outlives the time to full by grace.
local function save(state_key, st, ps, now, grace, done, till)
  local value
  local x = (st.costed or 0) > 0
  if #st == 1 and not x then
    value = string.format('%d %d %d %d %d', done, till, st[1].level, st[1].anchor, FORMAT)
  else
    -- One string.format for every number: far cheaper than one each.
    local parts = {done, till}
    for i = 1, #st do
      parts[#parts + 1] = st[i].level
      parts[#parts + 1] = st[i].anchor
    end
    parts[#parts + 1] = FORMAT
    if x then
      parts[#parts + 1] = st.costed
      for i = 1, #st do
        parts[#parts + 1] = st[i].extra
      end
    end
    value = string.format(string.sub(string.rep('%d ', #parts), 1, -2), unpack(parts))
  end
  redis.call('SET', state_key, value, 'PX', ceil_ms(full_in(st, ps, now) + grace))
end

-- save_extras writes a state whose levels, done and until did not change
-- since load (a caller with costs queued): raw, the string load read, up to
-- its format version, then the callers with costs and each policy's
-- extra, keeping the TTL. Levels as stored, before load refilled them, are
-- as good as refilled ones: refill brings them to the same values at any
-- later instant.
local function save_extras(state_key, raw, st)
  local value = string.match(raw, '^' .. string.rep('%S+ ', 2 * #st + 2) .. '%S+')
  if (st.costed or 0) > 0 then
    local parts = {st.costed}
    for i = 1, #st do
      parts[i + 1] = st[i].extra
    end
    value = value .. string.format(string.rep(' %d', #parts), unpack(parts))
  end
  redis.call('SET', state_key, value, 'KEEPTTL')
end

-- add_done counts n more tickets as no longer queued (callers that left the
-- queue) and, when less is set, takes less.costed callers with costs and
-- their extra tokens (less[i] per policy) off the state's, keeping the rest
-- of the state and its TTL.
local function add_done(state_key, n, less)
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
    vals[#vals + 1] = tonumber(v)
  end
  local np = #less
  if #vals < 2 + 2 * np then return end
  local parts = {int(vals[1] + n)}
  for i = 2, 2 + 2 * np do
    parts[i] = int(vals[i])
  end
  parts[3 + 2 * np] = int(FORMAT)
  local costed = (vals[4 + 2 * np] or 0) - less.costed
  if costed > 0 then
    parts[4 + 2 * np] = int(costed)
    for i = 1, np do
      parts[4 + 2 * np + i] = int((vals[4 + 2 * np + i] or 0) - less[i])
    end
  end
  redis.call('SET', state_key, table.concat(parts, ' '), 'KEEPTTL')
end
