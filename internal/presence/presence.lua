-- presence.lua: one process's trace, and the count of the processes that
-- left one recently (internal/presence). The sorted set holds each
-- process's member, scored by the Redis time (ms) of its last trace;
-- members older than the window leave it here.
--
-- KEYS[1] the set ("<prefix>:{<name>}:procs")
-- ARGV[1] this process's member
-- ARGV[2] the window, ms
--
-- Reply: the processes traced within the window, this one included.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local window = tonumber(ARGV[2])
redis.call('ZADD', KEYS[1], now, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
redis.call('PEXPIRE', KEYS[1], 2 * window)
return redis.call('ZCARD', KEYS[1])
