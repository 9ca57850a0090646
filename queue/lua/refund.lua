-- refund.lua: what becomes of the tokens of a slot its caller did not use
-- at its instant: one that came too late for it starts now with them
-- (retime.lua), one that left gives them back (cancel.lua), when that is
-- exact; otherwise they stay spent: never an excess. Needs tokens.lua,
-- state.lua and entry.lua before it.
--
-- Both are exact when the bucket would have lost no refill to its
-- capacity had the tokens c stayed in it from the grant on: then it holds
-- c more than the books say over that span, and every grant made in it
-- keeps the tokens it was promised. That is when, for every policy, its
-- highest level over the span (the state's peaks, which count every grant
-- up to the last one promised: peaks.lua) and its level now
-- leave room for c:
--     max(peak over the span, level now) + c <= cap.
-- t0, where the span begins, is the slot.
--
-- A span in which a policy gained no refill lost none of it, whatever
-- its level: that policy passes without the peaks.
--
-- A late caller's grant moves from its slot to now: the span ends now,
-- and the bucket from now on is the one the books already have (the
-- grant happens, only later), so its level does not change; the peaks
-- over the span rise by c. A caller that leaves gives its tokens back:
-- the span has no end, the level rises by c now, the peaks from t0 on by
-- c. At saturation the bucket's level before each grant is about the
-- grant's own tokens, so either is exact however late the caller comes,
-- within grace. Otherwise (a bucket that filled since, a room older than
-- grace or from another configuration, peaks that do not reach back to
-- t0, a rolling window, whose grants stay logged) the slot's tokens stay
-- spent.

-- quiet_moves: no_refill may judge a move (retime.lua sets it from its
-- caller's word: Queue.Retime's quiet).
local quiet_moves = false

-- slot_anchors reads a room's anchors (entry.lua's slot_value): per
-- policy, a number or false, and whether they are the slot's own
-- (take_at's, "@...") rather than those the slot's script left.
local function slot_anchors(as)
  local own = string.sub(as, 1, 1) == '@'
  local out, i = {}, 0
  for a in string.gmatch(own and string.sub(as, 2) or as, own and '[^;]+' or '[^,]+') do
    i = i + 1
    out[i] = tonumber(a) or false
  end
  return out, own
end

-- no_refill says whether a token bucket policy p (state s now) counts no
-- refill in (t0, upto]: a is the slot's anchor (tokens.lua's slot_anchor),
-- whose grid a + k*freq holds the refills the books count after t0; a
-- later script only moves that grid later (take_at's lag_shift,
-- feedback.lua's hold), never earlier. The next refill after t0 comes at
-- the first point of that grid past t0 or later (an anchor past t0 is a
-- shift, which adds no token: then a period after it). The peaks
-- reaching back to t0 (their floor) say the state is the same since: one
-- created afresh (its keys lost) starts them later.
local function no_refill(st, p, s, a, t0, upto)
  if p.kind ~= 0 or not a or s.anchor < a or not st.pk or t0 < st.pk.floor then
    return false
  end
  -- The grid's last point by t0 (tokens.lua's refill; a itself when a is
  -- t0 or past it), then the next.
  local _, at = refill(0, a, t0, p.cap, p.amount, p.freq)
  return at + p.freq > upto
end

-- unused_back takes the tokens ks (one per policy) of the slot whose slot
-- key's value (entry.lua) is value off the books from its grant until
-- upto (a late caller that starts then), or for good (upto nil: a caller
-- that left), in st (loaded under the configuration cid, at now), when
-- that is exact. It returns whether it did.
local function unused_back(st, ps, now, grace, value, ks, cid, upto)
  local t0, id, as = string.match(value, '^(%d+) %d+ (%S+) %S+ %S+ ?(%S*)')
  local own
  t0 = tonumber(t0)
  as, own = slot_anchors(as or '')
  if not t0 or id ~= cid or now - t0 > grace then
    return false
  end
  -- A grant moves later, never earlier: a slot still ahead of upto (a
  -- caller that retimes before its slot, its clock or its reckoning of
  -- Redis's off) holds tokens the bucket does not have yet.
  -- scheduler/TestGiveBacksKeepThePromise's seed 10 broke the promise by
  -- one, in 2 of 8 runs beside a busy loop, with a caller that retimed
  -- 10 ms before its slot and was moved to now.
  if upto and t0 > upto then
    return false
  end
  for i = 1, #ps do
    local p, s = ps[i], st[i]
    if ks[i] > 0 then
      if p.kind == ROLLING then return false end
      -- A policy that gained no refill since the slot (its anchor, the
      -- last refill, is still the one the script that gave the slot
      -- left, the slot value's, and that one came no later than the
      -- slot) lost none: the tokens kept over the span only sat in it (a
      -- capacity of one, its caller back within a period). An anchor
      -- after the slot was moved there by a later grant of the same
      -- script (the refill lag of a slot another policy held back): a
      -- refill that grant's books counted may lie in the span, and the
      -- tokens kept would have overflowed it. Seed 10 of
      -- scheduler/TestGiveBacksKeepThePromise broke the promise by one,
      -- in 2 of 18 runs beside a busy loop, with such a move (a caller
      -- moved from its slot 4 ms before the anchor to 2 ms after it,
      -- the next grant 200 µs later); 0 of 36 since. For a caller that
      -- reads its replies promptly (quiet_moves: a grant moved to now
      -- then starts within MaxLateness of it), no refill in the span by
      -- the slot's own anchor is enough, whatever grants came after it
      -- (no_refill): a capacity of one at saturation, its caller back
      -- before the next refill, keeps its token.
      local quiet = upto and as[i] and as[i] == s.anchor and as[i] <= t0
      if not quiet and upto and own and quiet_moves then
        quiet = no_refill(st, p, s, as[i], t0, upto)
      end
      local top = not quiet and peak_since(st, i, t0, upto)
      if not quiet and (not top or math.max(top, s.level) + ks[i] > p.cap) then
        return false
      end
    end
  end
  if not upto then
    for i = 1, #ps do
      st[i].level = st[i].level + ks[i]
    end
  end
  peaks_raise(st, ps, t0, ks, upto)
  return true
end

-- move_now moves the grant of the slot whose slot key's value is value
-- (tokens ks) to now, when that is exact (unused_back): a caller starts
-- now with them, the one that came too late for it (retime.lua) or one
-- that claimed it (claim.lua). It returns whether it did.
local function move_now(st, ps, now, grace, value, ks, cid)
  -- Never into a hold (feedback.lua): the upstream said to wait.
  if (st.hold or 0) > now and held(st, ks) then
    return false
  end
  if not unused_back(st, ps, now, grace, value, ks, cid, now) then
    return false
  end
  -- The bucket just before now held the tokens it kept for this grant.
  for i = 1, #ps do
    if ks[i] > 0 then note_peak(st, i, lag_peak(ps[i], st[i].level + ks[i], now, st[i].anchor), now) end
  end
  return true
end
