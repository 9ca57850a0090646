-- change.lua: a live change of the bucket's policies, for every process at
-- once. In one atomic script it checks that the configuration in force is
-- still the one the change was computed against, carries each policy's
-- tokens over to the new policies by the rule given, rewrites the costs of
-- the callers queued with costs of their own for the new policies (and
-- drops those whose cost the new policies could never grant: their polls
-- find them lost and they enter again, to be refused), saves the state
-- under the new configuration, stores the new configuration, releases the
-- scheduler lock (the scheduler that held it is fenced at its next step; a
-- new one steps under the new policies at once) and tells every process on
-- the wake channel.
--
-- KEYS[1] queue, KEYS[2] state, KEYS[3] config, KEYS[4] lock (as in enqueue.lua),
-- KEYS[5..7] the prefix of the named lanes' lists, the set of classes and
-- the prefix of the classes' sets (lanes.lua): their callers too
-- ARGV[1] the new config key's value, "<format> <id> <json>" (config.go)
-- ARGV[2] tokens rule: 0 proportionally, 1 as they are (at most the new
--         capacity), 2 reset (full, as a new bucket)
-- ARGV[3] grace µs added to the state's TTL
-- ARGV[4] wake channel
-- ARGV[5..] the policies in force (read_policies: id, n, then cap, amount,
--         freq µs, call, kind each), then the new policies, then for each new
--         policy two old indexes (1-based, 0: none): the policy whose
--         tokens it inherits, and the policy whose cost (its unit's) a
--         queued caller's cost of it is
--
-- Reply {1, callers dropped, callers queued} once changed, or {0} when the
-- configuration in force is no longer the one given (read it again).
--
-- Tokens promised to slots already assigned (a negative level) stay
-- promised: those callers start at their slots, handed out under the old
-- policies within the lookahead. Every refill after the change is the new
-- policy's, counted from now.
local ops, i, _, oid = read_policies(ARGV, 5)
local cur = redis.call('GET', KEYS[3])
if not cur or string.match(cur, '^%d+ (%S+)') ~= oid then
  return {0}
end
local nps, j, _, nid = read_policies(ARGV, i)
local mode = tonumber(ARGV[2])
local grace = tonumber(ARGV[3])
local now = now_us()
local st, done = load(KEYS[2], ops, now, KEYS[3], oid)
local nst = {id = nid, costed = 0, hold = st.hold, held = 0} -- a hold goes on, over every policy
local from, cost_from = {}, {}
for k = 1, #nps do
  local p = nps[k]
  from[k], cost_from[k] = tonumber(ARGV[j + 2 * k - 2]), tonumber(ARGV[j + 2 * k - 1])
  local level = p.cap
  local f = from[k]
  if f > 0 then
    local l = st[f].level
    local free, owed = math.max(l, 0), math.min(l, 0)
    if mode == 0 then
      free = math.floor(free * p.cap / ops[f].cap)
    elseif mode == 1 then
      free = math.min(free, p.cap)
    else
      free = p.cap
    end
    level = free + owed
  end
  nst[k] = {level = level, anchor = now, extra = 0}
  if p.kind == FIXED then -- the window in progress, as load starts one
    local lag = math.min(math.floor(p.freq / 2), FRESH_LAG_US)
    nst[k].anchor = lag + math.floor((now - lag) / p.freq) * p.freq
  end
  if nst.hold > now and p.kind ~= ROLLING then -- as feedback.lua leaves a held policy
    nst[k].anchor = math.max(nst[k].anchor, nst.hold)
  end
end

-- Rolling windows (tokens.lua, "Windows"): a new one that inherits from a
-- rolling window of the same length keeps its log (unless the rule is
-- reset), its tokens used staying used; any other starts with its tokens
-- used (by the rule above) logged now, to come back a window from now.
-- The logs of the old ones go.
if ops.rolling > 0 or nps.rolling > 0 then
  LOG_BASE = string.sub(KEYS[2], 1, -6) .. 'window:'
  local logs = {}
  for f = 1, #ops do
    if ops[f].kind == ROLLING then
      logs[f] = redis.call('LRANGE', log_key(f), 0, -1)
      redis.call('DEL', log_key(f))
    end
  end
  for k = 1, #nps do
    local p, f = nps[k], from[k]
    if p.kind == ROLLING then
      local s = nst[k]
      s.anchor, s.pend = 0, {}
      if f > 0 and logs[f] and ops[f].freq == p.freq and mode ~= 2 then
        local used = 0
        for _, e in ipairs(logs[f]) do
          local t, c = parse_entry(e)
          if t + window_span(p) >= now then -- still in the window (load counted the others back)
            s.pend[#s.pend + 1] = {t, c}
            s.anchor, used = t, used + c
          end
        end
        s.level = p.cap - used
      elseif s.level < p.cap then
        s.pend[1] = {now, p.cap - s.level}
        s.anchor = now
      end
    end
  end
end

-- The queued callers with costs of their own, in every lane: costs for
-- the new policies.
local dropped, qlen = 0, 0
-- rewrite rewrites the costs of the callers of list key.
local function rewrite(key)
  local ttl = redis.call('PTTL', key)
  local kept = {}
  for _, e in ipairs(redis.call('LRANGE', key, 0, -1)) do
    local id, est, costs = entry_parts(e)
    if costs then
      local ncs, fits = {}, true
      for k = 1, #nps do
        local c = cost_from[k] > 0 and costs[cost_from[k]] or 0
        if c > nps[k].cap then fits = false end
        ncs[k] = c
      end
      if fits then
        kept[#kept + 1] = entry(id, est, table.concat(ncs, ','))
        nst.costed = nst.costed + 1
        for k = 1, #nps do nst[k].extra = nst[k].extra + ncs[k] - nps[k].call end
      else
        dropped = dropped + 1
      end
    else
      kept[#kept + 1] = e
    end
  end
  redis.call('DEL', key)
  for b = 1, #kept, 4096 do
    redis.call('RPUSH', key, unpack(kept, b, math.min(b + 4095, #kept)))
  end
  if #kept > 0 and ttl > 0 then
    redis.call('PEXPIRE', key, ttl)
  end
  return #kept
end
local lists = {KEYS[1]}
for _, p in ipairs(redis.call('ZRANGE', KEYS[6], 0, -1)) do
  for _, name in ipairs(redis.call('ZRANGE', KEYS[7] .. p, 0, -1)) do
    lists[#lists + 1] = KEYS[5] .. name
  end
end
for _, key in ipairs(lists) do
  if st.costed > 0 then
    qlen = qlen + rewrite(key)
  else
    qlen = qlen + redis.call('LLEN', key)
  end
end

redis.call('DEL', KEYS[4])
redis.call('SET', KEYS[3], ARGV[1])
save(KEYS[2], nst, nps, now, grace, done + dropped, 0, KEYS[3])
config_notice(ARGV[4], nid)
return {1, dropped, qlen}
