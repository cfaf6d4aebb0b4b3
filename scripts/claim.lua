-- claim: take a key, or say why it cannot be taken.
-- KEYS[1] record hash, KEYS[2] lease string (same hash tag)
-- ARGV: token, fingerprint, lease ms, retention ms, max attempts (0 = no limit), scope, id
-- Returns one of:
--   {1, fence, attempt, recovered}  ACQUIRED
--   {2, lease ms left}              IN_PROGRESS
--   {3, result}                     REPLAY
--   {4}                             MISMATCH
--   {5, attempts, last error}       EXHAUSTED
local rec, lease = KEYS[1], KEYS[2]
local token, fp = ARGV[1], ARGV[2]

-- The common answers first, reading no more than they need. A different
-- payload under the same key learns nothing else about it.
local f = redis.call('HMGET', rec, 'st', 'fp', 'res')
local st = f[1]
if st == 'c' then
  if f[2] ~= fp then return {4} end
  return {3, f[3]}
end

local lease_ms, ttl_ms, max = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local keep_ms = math.max(ttl_ms, lease_ms)
if not st then
  -- A first attempt released just before leaves its token in the lease
  -- key, so that release's retry (go-redis resends a script whose reply
  -- was lost) still answers OK after this claim re-created the record.
  local released, ptok = redis.call('GET', lease), ''
  if released and string.sub(released, 1, 1) == '~' then ptok = string.sub(released, 2) end
  redis.call('HSET', rec, 'st', 'p', 'fp', fp, 'tok', token, 'fen', 1, 'att', 1, 'rcv', 0,
    'sc', ARGV[6], 'id', ARGV[7], 'ptok', ptok)
  redis.call('PEXPIRE', rec, keep_ms)
  redis.call('SET', lease, token, 'PX', lease_ms)
  return {1, 1, 1, 0}
end

if f[2] ~= fp then return {4} end

f = redis.call('HMGET', rec, 'tok', 'fen', 'att', 'rcv', 'err')
local fence, att = tonumber(f[2]), tonumber(f[3])
if st == 'p' then
  if f[1] == token then
    -- The same claim sent again (a client retry after a lost reply): same answer.
    redis.call('SET', lease, token, 'PX', lease_ms)
    return {1, fence, att, tonumber(f[4])}
  end
  local left = redis.call('PTTL', lease)
  if left ~= -2 then return {2, math.max(left, 1)} end
elseif st ~= 'f' then
  return redis.error_reply('idemguard: record has unknown state')
end

-- Failed, or pending with its lease gone (the holder died): take it over.
local recovered, ptok = 0, f[1]
if st == 'p' then recovered, ptok = 1, '' end
if max > 0 and att >= max then
  local reason = f[5] or ''
  if st == 'p' then
    reason = 'lease expired'
    redis.call('HSET', rec, 'st', 'f', 'err', reason)
  end
  return {5, att, reason}
end
fence, att = fence + 1, att + 1
-- ptok: the holder that ended its claim by fail or release, so a retry of
-- that call answers OK after this claim took the key over.
redis.call('HSET', rec, 'st', 'p', 'tok', token, 'fen', fence, 'att', att, 'rcv', recovered, 'ptok', ptok)
redis.call('PEXPIRE', rec, keep_ms)
redis.call('SET', lease, token, 'PX', lease_ms)
return {1, fence, att, recovered}
