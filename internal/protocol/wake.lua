-- wake.lua: a wake message (its Go twin is wake.go), published by the
-- scheduler on the bucket's wake channel to tell queued callers their slot:
-- space-separated pairs "<entry> <slot µs> <entry> <slot µs> ...".

-- wake_add appends a caller's entry and slot to the list of a message.
local function wake_add(list, e, slot)
  list[#list + 1] = e
  list[#list + 1] = string.format('%d', slot)
end

-- wake_publish sends the message, if it names anyone.
local function wake_publish(channel, list)
  if #list > 0 then
    redis.call('PUBLISH', channel, table.concat(list, ' '))
  end
end

-- config_notice tells every process on the channel that the configuration
-- id is now in force (a live change): "config <id>". An entry always holds
-- a '|', so the message cannot be mistaken for a wake message; a process
-- that predates it reads a pair naming nobody.
local function config_notice(channel, id)
  redis.call('PUBLISH', channel, 'config ' .. id)
end
