--lib
-- variant: single-policy fast lane inline, no put closure
local now = now_us()
local lookahead = tonumber(ARGV[1])
local max_queue = tonumber(ARGV[2])
local max_wait = tonumber(ARGV[3])
local grace = tonumber(ARGV[4])
local ps, i = read_policies(ARGV, 5)
local m = tonumber(ARGV[i])
local st, done, till, fresh = load(KEYS[2], ps, now)
local qlen = redis.call('LLEN', KEYS[1])
if m == 1 and qlen == 0 and #ps == 1 then
  local p, s = ps[1], st[1]
  local slot = slot_for(s.level, s.anchor, now, 1, p.amount, p.freq)
  if slot - now <= lookahead and (max_wait == 0 or slot - now <= max_wait) then
    s.level = s.level - 1
    redis.call('SET', KEYS[2], string.format('%d %d %d %d', done + 1, till, s.level, s.anchor), 'PX', ceil_ms(full_in(st, ps, now) + grace))
    return {now, 0, done + 1, slot == now and 0 or 1, slot - now, 0}
  end
end
return {now, 0, 0, 2, 0, 1}
