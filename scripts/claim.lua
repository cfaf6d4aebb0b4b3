-- claim: take a key, or say why it cannot be taken. The client tries a
-- native SET NX GET first; this script runs when that found a record it
-- cannot answer from alone (another holder's pending record, a failed or
-- released one), and answers every case itself.
-- KEYS[1] the record
-- ARGV: token, fingerprint (both encoded as in the record), lease ms,
--       retention ms, max attempts (0 = no limit), key (uvarint length +
--       scope, uvarint length + id)
-- Returns one of:
--   {1, fence, attempt, recovered, record}  ACQUIRED, with the pending
--                                   record as it stands
--   {2, lease ms left}              IN_PROGRESS
--   {3, result}                     REPLAY
--   {4}                             MISMATCH
--   {5, attempts, last error}       EXHAUSTED
local v = redis.pcall('GET', KEYS[1])
local bad, st, rcv, fence, att, fp, tp, tok, pp, ep, bp, ret, kp, rp, sp = decode(v)
if bad then return corrupt(bad) end
local name, mytok, myfp = KEYS[1], ARGV[1], ARGV[2]
local lease_ms, ret_ms, max = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])

-- take writes this claim's pending record; err is the last error, encoded;
-- steps, if any, are the earlier attempts' steps, which it keeps.
local function take(f, a, recovered, ptok, err, steps)
  local nv = head('p', recovered, f, a) .. myfp .. mytok .. ptok .. err .. uvenc(ret_ms) .. ARGV[6]
  if steps then nv = '\2' .. sub(nv, 2) .. steps end
  redis.call('SET', name, nv, 'PX', string.format('%d', ret_ms + lease_ms))
  return {1, f, a, recovered and 1 or 0, nv}
end

if not v then return take(1, 1, false, NONE, '\0') end
-- A first attempt released just before: a first attempt again, but with
-- the next fence (the released holder ran, and a write of its may still
-- be on its way downstream); its token stays as ptok, so that release's
-- retry (go-redis resends a script whose reply was lost) still answers OK
-- after this claim took the key.
if st == 'r' then
  if fence >= MAXN then return corrupt('fence cannot grow') end
  return take(fence + 1, 1, false, tok, '\0')
end

-- A different payload under the same key learns nothing else about it.
if sub(v, fp, tp - 1) ~= myfp then return {4} end
if st == 'c' then return {3, sub(v, rp)} end

if st == 'p' then
  if tok == mytok then
    -- The same claim sent again (a client retry after a lost reply): same answer.
    return {1, fence, att, rcv and 1 or 0, v}
  end
  local pttl = redis.call('PTTL', name)
  if pttl < 0 then return corrupt('pending record without expiry') end
  local left = pttl - ret
  if left > 0 then return {2, left} end
end

-- A copy of this claim that arrives after its holder ended it (go-redis
-- re-sends a claim whose reply was lost; the guard releases a claim whose
-- answer it never heard): it takes nothing, so the key is taken once.
if st == 'f' and tok == mytok then return {2, 0} end

-- Failed, or pending with its lease gone (the holder died): take it over.
local expired = st == 'p'
if max > 0 and att >= max then
  if expired then
    local err = 'lease expired'
    redis.call('SET', name, sub(v, 1, 1) .. (rcv and 'F' or 'f') .. sub(v, 3, ep - 1) .. uvenc(#err) .. err .. sub(v, kp), 'KEEPTTL')
    return {5, att, err}
  end
  local n, i = uvar(v, ep)
  return {5, att, sub(v, i, i + n - 1)}
end
if fence >= MAXN then return corrupt('fence cannot grow') end
if att >= MAXN then return corrupt('attempts cannot grow') end
-- ptok: the holder that ended its claim by fail, so a retry of that call
-- answers OK after this claim took the key over. A holder whose lease ran
-- out never ended its claim.
local ptok = NONE
if not expired then ptok = tok end
return take(fence + 1, att + 1, expired, ptok, sub(v, ep, bp - 1), sp and sub(v, sp))
