local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local cap, amount, freq = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8])
local raw = redis.call('GET', KEYS[2])
local done, till, level, anchor = 0, 0, cap, now
if raw then
  local d, u, l, a = string.match(raw, '^(%S+) (%S+) (%S+) (%S+)')
  done, till, level, anchor = tonumber(d), tonumber(u), tonumber(l), tonumber(a)
  local n = math.floor((now - anchor) / freq)
  if n > 0 then level = math.min(cap, level + n * amount); anchor = anchor + n * freq end
end
local qlen = redis.call('LLEN', KEYS[1])
if qlen == 0 and level >= 1 then
  level = level - 1
  redis.call('SET', KEYS[2], string.format('%d %d %d %d', done + 1, till, level, anchor), 'PX', 10000)
  return {now, 0, done + 1, 0, 0, 0}
end
return {now, 0, 0, 2, 0, 1}
