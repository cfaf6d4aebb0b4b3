-- release: undo the owner's claim, as if it had never been made.
-- A first attempt leaves a released marker that reads as absent (kept a
-- minute, so a retry of this call still finds its token after another
-- claim took the key); a later attempt returns to failed with the attempt
-- uncounted, so the fence still only grows. A claim whose record holds
-- steps cannot be undone (their effects happened): it returns to failed,
-- keeping them, with the attempt uncounted unless it was the first.
-- KEYS[1] the record; ARGV: token (encoded)
-- Returns 1 (OK) or 0 (LOST).
local v = redis.pcall('GET', KEYS[1])
local bad, st, rcv, fence, att, fp, tp, tok, pp, ep, bp, ret, kp, rp, sp = decode(v)
if bad then return corrupt(bad) end
if not v or st == 'r' then return 1 end
if tok ~= ARGV[1] then
  -- A retry of this release, after another claim took the key over.
  if sub(v, pp, ep - 1) == ARGV[1] then return 1 end
  return 0
end
if st == 'f' then return 1 end
if st ~= 'p' then return 0 end
if att <= 1 and not sp then
  redis.call('SET', KEYS[1], '\1r' .. sub(v, 3, pp - 1) .. NONE .. '\0', 'PX', 60000)
else
  local nv = head('f', rcv, fence, math.max(att - 1, 1)) .. sub(v, fp, bp - 1) .. sub(v, kp)
  if sp then nv = '\2' .. sub(nv, 2) end
  redis.call('SET', KEYS[1], nv, 'KEEPTTL')
end
return 1
