-- cancel.lua: a caller gives up its place.
--
-- KEYS[1] queue, KEYS[2] slots (as in enqueue.lua)
-- ARGV[1] caller ID
--
-- Reply: 0 removed from the queue before it had a slot: no token spent;
-- 1 it had a slot: removed, that token is spent (nobody else gets it);
-- 2 unknown ID (already consumed or expired).
if redis.call('LREM', KEYS[1], 1, ARGV[1]) == 1 then
  return 0
end
if redis.call('ZREM', KEYS[2], ARGV[1]) == 1 then
  return 1
end
return 2
