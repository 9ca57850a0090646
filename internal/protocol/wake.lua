-- wake.lua: a wake message (its Go twin is wake.go), published by the
-- scheduler on the bucket's wake channel to tell queued callers their slot:
-- space-separated pairs "<entry> <slot µs> <entry> <slot µs> ...".

-- wake_add appends a caller's entry and slot to the list of a message.
local function wake_add(list, e, slot)
  list[#list + 1] = e
  list[#list + 1] = string.format('%d', slot)
end

-- wake_told says whether the step tells a caller whose entry carries the
-- estimate est its slot: one pushed without an estimate (0), one whose
-- slot comes more than lead µs before its estimate (it would poll too
-- late), and one whose slot comes more than lead µs after it: callers
-- ahead of it were late and took the next slots first, and its poll at
-- its estimate found it still queued (poll.lua's told), after which it
-- waits for this message rather than polling again at each new estimate.
local function wake_told(est, slot, lead)
  return est == 0 or slot < est - lead or slot > est + lead
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
