-- cancel.lua: callers give up their places, one or many at once.
--
-- KEYS[1] queue, KEYS[2] slots (as in enqueue.lua)
-- ARGV[1..] each caller's entry ("<id>|<estimate>"), or its bare ID when
--         the caller gave up before its enqueue's reply told it the entry
--         (then the entry is searched for: a rare path, O(queue length))
--
-- Reply, one per caller: 0 removed from the queue before it had a slot:
-- no token spent; 1 it had a slot: removed, that token is spent (nobody
-- else gets it); 2 unknown (already consumed, expired, or never arrived).
local function find(prefix, list)
  for _, e in ipairs(list) do
    if string.sub(e, 1, #prefix) == prefix then
      return e
    end
  end
end

local out = {}
for c = 1, #ARGV do
  local entry = ARGV[c]
  if not string.find(entry, '|', 1, true) then
    local prefix = entry .. '|'
    entry = find(prefix, redis.call('LRANGE', KEYS[1], 0, -1))
      or find(prefix, redis.call('ZRANGE', KEYS[2], 0, -1))
      or entry
  end
  if redis.call('LREM', KEYS[1], 1, entry) == 1 then
    out[c] = 0
  elseif redis.call('ZREM', KEYS[2], entry) == 1 then
    out[c] = 1
  else
    out[c] = 2
  end
end
return out
