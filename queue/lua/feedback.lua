-- feedback.lua: what the upstream said, applied to the bucket for every
-- process at once (bucket.Feedback, Hold, Sync; docs/upstream.md).
--
-- KEYS[1] queue, KEYS[2] state, KEYS[3] config (as in enqueue.lua),
-- KEYS[4] refunds (retime.lua): a hold or a sync counts there as a change
-- of the refills, so that a late caller's give-back does not count past
-- refills on a grid that moved
-- ARGV[1] grace µs added to the state's TTL
-- ARGV[2] hold µs from now (0: none): no slot of a held policy comes
--         before now + hold
-- ARGV[3] which policies the hold stops, "i1,i2,..." (1-based); "" all
-- ARGV[4..] policies (read_policies), then m, then m syncs: the policy's
--         index (1-based), the tokens remaining upstream, and µs from now
--         until its refills resume (0: at once)
--
-- Hold: the state's hold (state.lua) moves to now + hold, or stays later:
-- no slot that takes from a held policy comes before it, and a held
-- policy gains nothing during it (its refills resume at its end): it
-- keeps the tokens it had, so a long one, such as a monthly quota, keeps
-- its budget, and a short one saturated when the upstream refused comes
-- out of the hold empty, never a burst of what accrued. Callers queued are re-timed by the scheduler's next steps; a
-- slot already handed out (within the lookahead) keeps its time: the reply
-- counts them.
-- Sync: a policy's level is brought down to the tokens remaining upstream
-- (never raised), and when it was lowered, its next refill comes no
-- sooner than the reset.
--
-- Reply {slots already handed out within the hold, syncs that lowered a
-- level}.
local now = now_us()
local grace = tonumber(ARGV[1])
local hold = tonumber(ARGV[2])
local ps, i, _, id = read_policies(ARGV, 4)
local st, done, till = load(KEYS[2], ps, now, KEYS[3], id)
local owed, lowered = 0, 0
if hold > 0 then
  local held = parse_costs(ARGV[3])
  local mask = 0
  for _, h in ipairs(held or {}) do
    mask = mask + 2 ^ (h - 1)
  end
  for k = 1, #ps do
    if st[k].level < 0 and (mask == 0 or has_bit(mask, k)) then
      owed = math.max(owed, -st[k].level)
    end
  end
  -- Two holds at once: the later end, over the policies of both.
  if st.hold > 0 and (st.held == 0 or mask == 0) then
    mask = 0
  elseif st.hold > 0 then
    for k = 1, #ps do
      if has_bit(st.held, k) and not has_bit(mask, k) then mask = mask + 2 ^ (k - 1) end
    end
  end
  st.hold, st.held = math.max(st.hold, now + hold), mask
  -- A held policy gains nothing during the hold: its refills resume at
  -- its end (tokens.lua).
  for k = 1, #ps do
    -- (A rolling window's anchor is its log's last slot: its grants
    -- still leave the window during the hold, and the hold keeps its
    -- slots back.)
    if (mask == 0 or has_bit(mask, k)) and ps[k].kind ~= ROLLING then
      st[k].anchor = math.max(st[k].anchor, st.hold)
    end
  end
end
local m = tonumber(ARGV[i])
for c = 1, m do
  local k = tonumber(ARGV[i + 3 * c - 2])
  local rem = tonumber(ARGV[i + 3 * c - 1])
  local reset = tonumber(ARGV[i + 3 * c])
  local p, s = ps[k], st[k]
  if p and rem < s.level and p.kind == ROLLING then
    -- The tokens the upstream says are gone are logged as a grant now:
    -- they come back when a window has passed.
    local ks = {}
    for j = 1, #ps do ks[j] = 0 end
    ks[k] = s.level - rem
    window_record(st, ps, now, ks)
    s.level = rem
    lowered = lowered + 1
  elseif p and rem < s.level then
    s.level = rem
    if reset > 0 then
      s.anchor = math.max(s.anchor, now + reset - p.freq)
    end
    lowered = lowered + 1
  end
end
if hold > 0 or lowered > 0 then
  save(KEYS[2], st, ps, now, grace, done, till, KEYS[3])
  local marks = parse_costs(redis.call('GET', KEYS[4]) or '') or {}
  marks[1] = (marks[1] or 0) + 1
  for k = 2, #ps + 1 do marks[k] = marks[k] or 0 end
  local out = {}
  for k = 1, #marks do out[k] = string.format('%d', marks[k]) end
  redis.call('SET', KEYS[4], table.concat(out, ','), 'PX', ceil_ms(3 * grace))
end
return {owed, lowered}
