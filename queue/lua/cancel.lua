-- cancel.lua: a caller gives up its place.
--
-- KEYS[1] queue, KEYS[2] slots (as in enqueue.lua)
-- ARGV[1] the caller's entry ("<id>|<estimate>"), or its bare ID when the
--         caller gave up before its enqueue's reply told it the entry (then
--         the entry is searched for: a rare path, O(queue length))
--
-- Reply: 0 removed from the queue before it had a slot: no token spent;
-- 1 it had a slot: removed, that token is spent (nobody else gets it);
-- 2 unknown (already consumed, expired, or never arrived).
local entry = ARGV[1]
if not string.find(entry, '|', 1, true) then
  local prefix = entry .. '|'
  local found = false
  for _, e in ipairs(redis.call('LRANGE', KEYS[1], 0, -1)) do
    if string.sub(e, 1, #prefix) == prefix then
      entry, found = e, true
      break
    end
  end
  if not found then
    for _, e in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
      if string.sub(e, 1, #prefix) == prefix then
        entry = e
        break
      end
    end
  end
end
if redis.call('LREM', KEYS[1], 1, entry) == 1 then
  return 0
end
if redis.call('ZREM', KEYS[2], entry) == 1 then
  return 1
end
return 2
