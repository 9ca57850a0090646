-- gcra.lua: a one-script reservation limiter (GCRA), the floor for "one
-- round trip per grant" in cmd/bench's comparison. Every call books the
-- next slot on Redis's clock and the caller sleeps until it; nothing is
-- ever refused or given back.
--
-- KEYS[1]  the limiter's key: its theoretical arrival time (TAT), µs on
--          Redis's clock, as a decimal string
-- ARGV[1]  emission interval, µs (one token per interval)
-- ARGV[2]  burst: how many callers may start at once on an idle limiter
--
-- Reply: {delay µs from Redis's now to the caller's slot, slot µs}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])

local tat = tonumber(redis.call('GET', KEYS[1]) or now)
if tat < now then
  tat = now
end
tat = tat + interval
-- Up to burst callers may hold slots ahead of the TAT's pace.
local slot = tat - burst * interval
if slot < now then
  slot = now
end
-- %d: Lua's default %.14g would round a 16-digit µs instant.
redis.call('SET', KEYS[1], string.format('%d', tat), 'PX', string.format('%d', math.ceil((tat - now) / 1000) + 1000))
return {slot - now, slot}
