-- cancel.lua: callers give up their places, one or many at once.
--
-- KEYS[1] queue, KEYS[2] slot key prefix, KEYS[3] state, KEYS[4] config
-- (as in enqueue.lua)
-- ARGV[1] the configuration id (read_policies) the calls are of
-- ARGV[2] each policy's call, "c1,c2,..." (to take the extras of callers
--         with costs of their own off the state's)
-- ARGV[3..] each caller's entry ("<id>|<estimate>[|<costs>]"), or its bare ID when
--         the caller gave up before its enqueue's reply told it the entry
--         (then the queue is searched for it: a rare path, O(queue length))
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
local removed = 0
local cid = ARGV[1]
local calls = parse_costs(ARGV[2])
local less = nil
for c = 3, #ARGV do
  local entry = ARGV[c]
  local id, est = entry_parts(entry)
  if not est then -- a bare ID
    entry = find(id .. '|', redis.call('LRANGE', KEYS[1], 0, -1))
  end
  if entry and redis.call('LREM', KEYS[1], 1, entry) == 1 then
    out[c - 2] = 0
    removed = removed + 1
    local _, _, costs = entry_parts(entry)
    if costs and calls then
      less = less or {costed = 0}
      less.costed = less.costed + 1
      for i = 1, #calls do less[i] = (less[i] or 0) + costs[i] - calls[i] end
    end
  elseif redis.call('DEL', KEYS[2] .. id) == 1 then
    out[c - 2] = 1
  else
    out[c - 2] = 2
  end
end
-- The state's done counts tickets no longer queued, so that the next
-- caller's ticket (done + its position) stays unique: leave it the rest.
if removed > 0 then
  add_done(KEYS[3], removed, less, KEYS[4], cid)
end
return out
