-- lanes.lua (queueio): the lanes with callers of one bucket, for Inspect,
-- read at once. It changes nothing. Its work is O(lanes with callers): a
-- sorted-set range per class with callers, a list length per lane, and
-- keeping the top ones in order as it goes.
-- Needs tokens.lua, entry.lua and lanes.lua (internal/protocol) before
-- it, for lanes.lua's reading of the lanes, so that a lane's count of
-- lanes is the one estimate.lua gives its new callers.
--
-- KEYS[1] the queue (the default lane's list), KEYS[2..5] the lanes'
--         keys (Keys.Lanes: the named lists' prefix, the classes, the
--         classes' prefix, the tags)
-- ARGV[1] how many lanes to list: those with the most callers
--
-- Reply {default, default_lanes, named, others, others_queued, rows...}
--   default        the default lane's callers
--   default_lanes  lanes.lua's lane_count for a new caller of the default
--                  lane: the lanes with callers of class 0, itself counted
--   named          the callers of every named lane
--   others         the lanes with callers beyond the ones listed, and
--   others_queued  their callers
--   rows           four values for each lane listed, the most callers
--                  first (then the higher priority, then the name): its
--                  name ('' for the default lane), priority, callers, and
--                  the lanes with callers of its class (lane_count)
-- No row when no named lane has callers: the default lane alone is the
-- bucket's queue.

local lk = {queue = KEYS[1], prefix = KEYS[2], classes = KEYS[3], class = KEYS[4], tags = KEYS[5]}
local top = tonumber(ARGV[1])
local dlen = redis.call('LLEN', lk.queue)
local out = {dlen, 1, 0, 0, 0}

-- The rows listed, in order; each lane past them is only counted.
local best = {}
local function before(a, b)
  if a[3] ~= b[3] then return a[3] > b[3] end
  if a[2] ~= b[2] then return a[2] > b[2] end
  return a[1] < b[1]
end
local function add(r)
  if #best == top and (top == 0 or not before(r, best[top])) then
    out[4], out[5] = out[4] + 1, out[5] + r[3]
    return
  end
  if #best == top then
    local last = best[top]
    out[4], out[5] = out[4] + 1, out[5] + last[3]
    best[top] = nil
  end
  local i = #best + 1
  while i > 1 and before(r, best[i - 1]) do
    best[i] = best[i - 1]
    i = i - 1
  end
  best[i] = r
end

if lanes_on(lk) then
  out[2] = lane_count(lk, '', 0, dlen)
  for _, p in ipairs(lane_classes(lk, dlen)) do
    -- A lane of the class whose list is empty (it expired) has no row,
    -- and lane_count counts it until a step forgets it, as estimate.lua
    -- does. lane_count is the same for every lane of the class (each is
    -- a member of it): counted once.
    local count
    for _, name in ipairs(redis.call('ZRANGE', lk.class .. p, 0, -1)) do
      local n = redis.call('LLEN', lane_list(lk, name))
      if n > 0 then
        out[3] = out[3] + n
        count = count or lane_count(lk, name, p, dlen)
        add({name, p, n, count})
      end
    end
  end
  if out[3] > 0 and dlen > 0 then add({'', 0, dlen, out[2]}) end
end
for _, r in ipairs(best) do
  for _, v in ipairs(r) do out[#out + 1] = v end
end
return out
