-- presence.lua: one process's trace, and the count of the processes that
-- left one recently (internal/presence). The sorted set holds each
-- process's member, scored by the Redis time (ms) of its last trace;
-- members older than the window leave it here. A set made afresh (the
-- first trace since Redis started empty, or since every process stopped
-- tracing) may not hold every process yet (they trace themselves again
-- one by one): its birth key (KEYS[2]) says so for a window.
--
-- KEYS[1] the set ("<prefix>:{<name>}:procs"), KEYS[2] its birth key (the
-- set's name then ":born")
-- ARGV[1] this process's member
-- ARGV[2] the window, ms
--
-- Reply {count, young}: the processes traced within the window, this one
-- included; young 1 while the set is younger than the window, else 0.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[2])
if redis.call('EXISTS', KEYS[1]) == 0 then
  redis.call('SET', KEYS[2], '1', 'PX', window)
end
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
redis.call('PEXPIRE', KEYS[1], 2 * window)
return {redis.call('ZCARD', KEYS[1]), redis.call('EXISTS', KEYS[2])}
