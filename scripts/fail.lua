-- fail: pending -> failed (retryable), for the owner only; attempts are kept.
-- KEYS[1] the record; ARGV: token (encoded), reason, retention ms
-- Returns 1 (OK) or 0 (LOST).
local v = redis.pcall('GET', KEYS[1])
local bad, st, rcv, fence, att, fp, tp, tok, pp, ep, bp, ret, kp, rp = decode(v)
if bad then return corrupt(bad) end
if not v or st == 'r' then return 0 end
if tok ~= ARGV[1] then
  -- A retry of this fail, after another claim took the failed key over.
  if sub(v, pp, ep - 1) == ARGV[1] then return 1 end
  return 0
end
if st == 'f' then return 1 end
if st ~= 'p' then return 0 end
local reason = ARGV[2]
-- The version byte and sub(v, kp) keep the steps, if any.
redis.call('SET', KEYS[1], sub(v, 1, 1) .. (rcv and 'F' or 'f') .. sub(v, 3, ep - 1) .. uvenc(#reason) .. reason .. sub(v, kp),
  'PX', ARGV[3])
return 1
