-- fast.lua: enqueue.lua's commonest case, a lone caller of a bucket far
-- from its limit, as a script of its own (queue/fast.go runs it first
-- when the last caller of its Queue who came alone was granted at once).
-- Its reply, the state it writes (state.lua's, byte for byte) and the
-- TTLs are enqueue.lua's (queue/TestFastMatchesEnqueue); when the case
-- is not its own it writes nothing and replies nil, and the caller runs
-- enqueue.lua.
--
-- KEYS[1] queue, KEYS[2] state, KEYS[3] config: enqueue.lua's first three;
-- KEYS[4] the set of the lanes' classes (lanes.lua): a caller waiting in a
-- named lane makes the case enqueue.lua's
-- ARGV[1] the configuration id this process runs under
-- ARGV[2..4] its one policy, a token bucket counting calls: cap, amount,
--         freq µs
-- ARGV[5] lookahead µs
-- ARGV[6] the longest the caller may wait, µs (the shorter of the
--         bucket's max wait and the caller's own; 0 = unbounded)
-- ARGV[7] grace µs
-- Reply: enqueue.lua's for one caller, {now, 0, ticket, kind, delay, 0}
-- (kind 0 or 1 granted, 4 wait too long), or nil.
--
-- Its case: the queue is empty, the state is of this format and this
-- configuration, no caller with costs is queued, no hold is recorded
-- (one that has passed is left to enqueue.lua, which writes it 0), the
-- peaks are well formed, and the caller's token comes within the
-- lookahead and no earlier than the peaks' last entry. Every number read
-- or written costs Redis some 2,000 instructions (strtod, sprintf), half
-- a command, so the peak entries that do not change are copied as
-- strings (scriptcost/callgrind.sh measures).
if redis.call('LLEN', KEYS[1]) ~= 0 or redis.call('EXISTS', KEYS[4]) ~= 0 then return false end
local raw = redis.call('GET', KEYS[2])
if not raw then return false end
local a = ARGV
local done, till, l, an, sid, floor, rest = string.match(raw, '^(%d+) (%d+) (%-?%d+) (%-?%d+) 2 (%S+) 0 %S+ 0 %S+ p(%-?%d+)(.*)$')
if sid ~= a[1] then return false end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
-- The peaks' entries: es as written, ts their times (strings until
-- read), vs their levels.
-- (Made with room for PEAK_ENTRIES + 2, the tables never grow: each
-- growth costs Redis more than the loop that fills them.)
local es, ts, vs, k, len = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, {0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, 0, 0
for e, et, ev in string.gmatch(rest, '(/(%-?%d+):(%-?%d+))') do
  k, len = k + 1, len + #e
  es[k], ts[k], vs[k] = e, et, tonumber(ev)
end
if len ~= #rest then return false end
local cap, amount, freq = tonumber(a[2]), tonumber(a[3]), tonumber(a[4])
local level, anchor = tonumber(l), tonumber(an)
if now > anchor then -- refill
  local d = now - anchor
  local n = math.floor(d / freq)
  if n * freq > d then n = n - 1 end
  if n > 0 then
    level, anchor = math.min(cap, level + n * amount), anchor + n * freq
  end
end
local slot = now -- slot_all
if level < 1 then slot = math.max(now, anchor + math.ceil((1 - level) / amount) * freq) end
local last = k > 0 and tonumber(ts[k])
-- A slot before the last entry of the peaks (tokens came back) is
-- enqueue.lua's.
if last and last > slot then return false end
if slot > now then
  if slot - now > tonumber(a[5]) then return false end
  local limit = tonumber(a[6])
  if limit > 0 and slot - now > limit then
    return {now, 0, tonumber(done) + 1, 4, slot - now, 0}
  end
end
-- take_at, one token.
local before, at = level, anchor
if slot > now and slot > anchor then
  local d = slot - anchor
  local n = math.floor(d / freq)
  if n * freq > d then n = n - 1 end
  if n > 0 then
    before, at = math.min(cap, level + n * amount), anchor + n * freq
    level = level - (level + n * amount - before)
  end
end
local lag = 5000 -- refill_lag
if amount >= 1 then lag = math.min(math.floor(math.ceil(cap / amount) * freq / 2), 5000) end
local peak = before -- lag_peak
local n = math.floor((slot + lag - at) / freq)
if n > 0 then peak = math.min(cap, before + n * amount) end
if at ~= slot then -- lag_shift
  anchor = anchor + math.max(0, slot + lag - math.floor((cap - before) / amount) * freq - at)
end
level = level - 1
-- peaks_update: the grant's entry goes last (merged with one at its
-- slot); then an entry no higher than the next goes, an entry older than
-- grace goes (the floor moves to it), and past PEAK_ENTRIES the two
-- neighbours closest in level merge. An entry whose level changed is
-- written anew (es[i] false).
peak = math.min(cap, peak)
if last == slot then
  if peak > vs[k] then vs[k], es[k] = peak, false end
else
  k = k + 1
  es[k], ts[k], vs[k] = false, slot, peak
end
local j = k - 1
while j >= 1 do
  if vs[j] <= vs[j + 1] then
    table.remove(es, j)
    table.remove(ts, j)
    table.remove(vs, j)
    k = k - 1
  end
  j = math.min(j - 1, k - 1)
end
local grace = tonumber(a[7])
local old = now - grace
while k > 0 and tonumber(ts[1]) < old do
  floor = math.max(tonumber(floor), tonumber(ts[1]))
  table.remove(es, 1)
  table.remove(ts, 1)
  table.remove(vs, 1)
  k = k - 1
end
while k > 8 do
  local best, at = math.huge, 1
  for i = 1, k - 1 do
    local d = math.max(0, (vs[i] - vs[i + 1]) / cap)
    if d < best then best, at = d, i end
  end
  if vs[at] > vs[at + 1] then vs[at + 1], es[at + 1] = vs[at], false end
  table.remove(es, at)
  table.remove(ts, at)
  table.remove(vs, at)
  k = k - 1
end
for i = 1, k do
  if not es[i] then es[i] = string.format(type(ts[i]) == 'string' and '/%s:%d' or '/%d:%d', ts[i], vs[i]) end
end
done = tonumber(done) + 1
local ttl = grace -- full_in + grace
if level < cap then ttl = ttl + math.max(0, anchor + math.ceil((cap - level) / amount) * freq - now) end
redis.call('SET', KEYS[2], string.format(type(floor) == 'string' and '%d %s %d %d 2 %s 0 0 0 0 p%s' or '%d %s %d %d 2 %s 0 0 0 0 p%d',
  done, till, level, anchor, a[1], floor) .. table.concat(es, '', 1, k), 'PX', string.format('%d', math.max(1, math.ceil(ttl / 1000))))
if math.floor(done / 64) ~= math.floor((done - 1) / 64) then -- state.lua's CONFIG_RENEW_EVERY
  redis.call('PEXPIRE', KEYS[3], 2592000000)
end
return {now, 0, done, slot == now and 0 or 1, slot - now, 0}
