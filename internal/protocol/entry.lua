-- entry.lua: a queue entry, "<id>|<estimated slot µs>" (its Go twin is
-- entry.go). The estimate is the slot the caller sleeps towards; 0 means
-- none (pushed by the push lane), so the scheduler always tells that caller
-- its slot on the wake channel.

-- entry makes the entry of caller id with estimate est (µs).
local function entry(id, est)
  return id .. '|' .. string.format('%d', est)
end

-- entry_parts returns the id and the estimate (a number) of an entry, or
-- the argument itself and nil when it is a bare id.
local function entry_parts(e)
  local id, est = string.match(e, '^(.*)|(%d+)$')
  if not id then
    return e, nil
  end
  return id, tonumber(est)
end
