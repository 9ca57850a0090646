-- entry.lua: a queue entry, "<id>|<estimated slot µs>" or, for a caller
-- with costs of its own, "<id>|<estimated slot µs>|<c1>,<c2>,..." (one
-- cost per policy, in tokens; its Go twin is entry.go). The estimate is the
-- slot the caller sleeps towards; 0 means none (pushed by the push lane),
-- so the scheduler always tells that caller its slot on the wake channel.

-- entry makes the entry of caller id with estimate est (µs) and costs (a
-- string "c1,c2,...", or "" for none of its own).
local function entry(id, est, costs)
  if costs and costs ~= '' then
    return id .. '|' .. string.format('%d', est) .. '|' .. costs
  end
  return id .. '|' .. string.format('%d', est)
end

-- parse_costs reads "c1,c2,..." into a table of numbers, or nil for "".
local function parse_costs(s)
  if not s or s == '' then return nil end
  local cs = {}
  for c in string.gmatch(s, '[^,]+') do
    cs[#cs + 1] = tonumber(c)
  end
  return cs
end

-- entry_parts returns the id, the estimate (a number) and the costs (a
-- table, or nil) of an entry, or the argument itself and nil when it is a
-- bare id.
local function entry_parts(e)
  -- One match serves both kinds (a queue holds mostly entries without
  -- costs, and the step reads every entry it pops).
  local id, est, costs = string.match(e, '^([^|]*)|(%d+)|?([%d,]*)$')
  if id then
    if costs ~= '' then
      return id, tonumber(est), parse_costs(costs)
    end
    return id, tonumber(est)
  end
  id, est = string.match(e, '^(.*)|(%d+)$') -- an ID with a '|' in it
  if not id then
    return e, nil
  end
  return id, tonumber(est)
end
