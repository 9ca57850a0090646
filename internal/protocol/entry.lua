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

-- A slot key holds "<slot µs> <step µs> <config id> <d>,<r1>,<r2>,...
-- <l1>,<l2>,... <a1>,<a2>,..." (its Go twin is ParseSlotValue in entry.go): the slot the
-- step gave its caller, when the step ran, under which configuration, the
-- refunds key then (the upstream's changes to the refills, and the tokens
-- late callers had given back per policy), and every
-- policy's level once the step had taken what it gave. The rest after the
-- slot is the caller's "room" (retime.lua): what tells whether giving its
-- tokens back later, should it come too late to use them, is exact. A bare
-- slot (no room) is read as well.

-- slot_value makes a slot key's value; refunds is the refunds key's value
-- ('' when missing). After the levels come the anchors: with anchors
-- (take_at's, of this slot's own grant), "@" then each policy's slot
-- anchor (tokens.lua's slot_anchor; "-" for none), ";" between them;
-- without, each policy's last refill as the script that gave the slot
-- left it, "," between them. refund.lua reads either. The pattern of the
-- version before the anchors does not match a value with them, so its
-- late callers' tokens stay spent; the version before "@" reads no
-- number from "@...;...": the same.
local function slot_value(slot, now, id, st, refunds, anchors)
  local ls, as = {}, {}
  for i = 1, #st do
    ls[i] = string.format('%d', st[i].level)
    if anchors then
      as[i] = anchors[i] and string.format('%d', anchors[i]) or '-'
    else
      as[i] = string.format('%d', st[i].anchor)
    end
  end
  if refunds == '' then
    local zs = {'0'}
    for i = 1, #st do zs[i + 1] = '0' end
    refunds = table.concat(zs, ',')
  end
  local anchored = anchors and '@' .. table.concat(as, ';') or table.concat(as, ',')
  return string.format('%d %d ', slot, now) .. id .. ' ' .. refunds .. ' ' .. table.concat(ls, ',') .. ' ' .. anchored
end

-- slot_of is the slot a slot key's value holds (nil: none). The
-- parentheses make string.match's nothing-found one nil: miniredis's
-- string.match returns no value at all then, which its tonumber refuses.
local function slot_of(v)
  return tonumber((string.match(v, '^(%-?%d+)')))
end

-- room_of is the room a slot key's value holds ('' for none).
local function room_of(v)
  return string.match(v, '^%-?%d+ (.*)$') or ''
end

-- TAKEN is the room of the slot value left for a caller whose slot a
-- running caller that held no slot of its own (one still queued, or
-- late and given none) took because this one had not come for it
-- (claim.lua's mark_taken): its slot, then TAKEN. Its tokens were used,
-- so they are nobody's to move or give back (refund.lua reads no room
-- in it); its caller, when it comes, is served as one too late for its
-- slot (retime.lua). protocol.Taken reads it.
local TAKEN = 't'
