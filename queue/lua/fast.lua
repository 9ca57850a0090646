-- fast.lua: enqueue.lua's commonest case, a lone caller of a bucket far
-- from its limit, done before anything else in the script (queue/scripts.go
-- puts it first), so that it returns before the shared functions are even
-- defined: making them costs Redis more than this whole case. KEYS and
-- ARGV are enqueue.lua's, and so is the reply; the state it reads and
-- writes is state.lua's, byte for byte (queue/TestFastMatchesEnqueue).
--
-- It serves one caller (m = 1) without costs of its own, on one token
-- bucket policy counting calls, when the state is of this format and this
-- configuration, no caller with costs is queued, no hold is in force, the
-- peaks have fewer than PEAK_ENTRIES entries, and the queue is empty: the
-- caller's token is taken (or it is refused for its wait) exactly as
-- enqueue.lua would, with take_at, peaks_update and save inlined for that
-- case. Anything else falls through to enqueue.lua, which reads again.
do
  local a = ARGV
  if a[9] == '1' and a[13] == '1' and a[14] == '0' and a[15] == '1' and a[17] == '' and redis.call('LLEN', KEYS[1]) == 0 then
    local raw = redis.call('GET', KEYS[2])
    local done, till, l, an, v, sid, h, c, pk, _
    if raw then
      done, till, l, an, v, sid, h, _, c, _, pk = string.match(raw, '^(%S+) (%S+) (%S+) (%S+) ?(%S*) ?(%S*) ?(%S*) ?(%S*) ?(%S*) ?(%S*) ?(%S*)')
    end
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
    local floor, rest
    if pk and v == '2' and sid == a[8] and c == '0' and (tonumber(h) or 1 / 0) <= now and not string.find(pk, ',', 1, true) then
      floor, rest = string.match(pk, '^p(%-?%d+)(.*)$')
    end
    -- The peaks' entries, times ts and levels vs (one policy: no commas).
    local ts, vs, k = {}, {}, 0
    if rest then
      for et, ev in string.gmatch(rest, '/(%-?%d+):(%-?%d+)') do
        k = k + 1
        ts[k], vs[k] = tonumber(et), tonumber(ev)
      end
    end
    if floor then
      local cap, amount, freq = tonumber(a[10]), tonumber(a[11]), tonumber(a[12])
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
      local lookahead, grace, limit, mine = tonumber(a[1]), tonumber(a[4]), tonumber(a[3]), tonumber(a[18])
      if mine > 0 and (limit == 0 or mine < limit) then limit = mine end
      -- A slot before the last entry of the peaks (tokens came back) is
      -- enqueue.lua's.
      if slot - now <= lookahead and not (k > 0 and ts[k] > slot) then
        if limit > 0 and slot - now > limit then
          return {now, 0, tonumber(done) + 1, 4, slot - now, 0}
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
        -- slot); then an entry no higher than the next goes, an entry older
        -- than grace goes (the floor moves to it), and past PEAK_ENTRIES
        -- the two neighbours closest in level merge.
        floor, peak = tonumber(floor), math.min(cap, peak)
        if k > 0 and ts[k] == slot then
          vs[k] = math.max(vs[k], peak)
        else
          k = k + 1
          ts[k], vs[k] = slot, peak
        end
        local j = k - 1
        while j >= 1 do
          if vs[j] <= vs[j + 1] then
            table.remove(ts, j)
            table.remove(vs, j)
            k = k - 1
          end
          j = math.min(j - 1, k - 1)
        end
        while k > 0 and ts[1] < now - grace do
          floor = math.max(floor, ts[1])
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
          vs[at + 1] = math.max(vs[at], vs[at + 1])
          table.remove(ts, at)
          table.remove(vs, at)
          k = k - 1
        end
        local e = {}
        for i = 1, k do e[i] = string.format('/%d:%d', ts[i], vs[i]) end
        done = tonumber(done) + 1
        local ttl = grace -- full_in + grace
        if level < cap then ttl = ttl + math.max(0, anchor + math.ceil((cap - level) / amount) * freq - now) end
        redis.call('SET', KEYS[2], string.format('%d %d %d %d 2 %s 0 0 0 0 p%d', done, tonumber(till), level, anchor, sid, floor) .. table.concat(e),
          'PX', string.format('%d', math.max(1, math.ceil(ttl / 1000))))
        if math.floor(done / 64) ~= math.floor((done - 1) / 64) then -- state.lua's CONFIG_RENEW_EVERY
          redis.call('PEXPIRE', KEYS[3], 2592000000)
        end
        return {now, 0, done, slot == now and 0 or 1, slot - now, 0}
      end
    end
  end
end
