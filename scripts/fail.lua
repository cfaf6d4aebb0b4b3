-- fail: pending -> failed (retryable), for the owner only; attempts are kept.
-- KEYS[1] the record; ARGV: token (encoded), reason, retention ms, and
-- optionally who fails it: '' (or none) its holder; 'stale' or 'force' an
-- operator (idemguard release) in the holder's name, who needs the record
-- to be that holder's pending one now (or, for a copy of its call sent
-- again, failed with the operator's reason), and with 'stale' its lease
-- run out (a lease the holder extended since the operator looked is left
-- alone).
-- Returns 1 (OK), 0 (LOST), or 2 (the lease is alive: nothing done).
local v = redis.pcall('GET', KEYS[1])
local bad, st, rcv, fence, att, fp, tp, tok, pp, ep, bp, ret, kp, rp = decode(v)
if bad then return corrupt(bad) end
if not v or st == 'r' then return 0 end
local op = ARGV[4] == 'stale' or ARGV[4] == 'force'
if tok ~= ARGV[1] then
  -- A retry of this fail, after another claim took the failed key over.
  if not op and sub(v, pp, ep - 1) == ARGV[1] then return 1 end
  return 0
end
if st == 'f' then
  -- A retry of this call (go-redis resends a script whose reply was lost):
  -- the holder's own, or an operator's, whose reason the record keeps.
  if not op or sub(v, ep, bp - 1) == uvenc(#ARGV[2]) .. ARGV[2] then return 1 end
  return 0
end
if st ~= 'p' then return 0 end
-- A pending record's key lives for its retention after the lease.
if ARGV[4] == 'stale' and redis.call('PTTL', KEYS[1]) > ret then return 2 end
local reason = ARGV[2]
-- The version byte and sub(v, kp) keep the steps, if any.
redis.call('SET', KEYS[1], sub(v, 1, 1) .. (rcv and 'F' or 'f') .. sub(v, 3, ep - 1) .. uvenc(#reason) .. reason .. sub(v, kp),
  'PX', ARGV[3])
return 1
