-- fail: pending -> failed (retryable), for the owner only; attempts are kept.
-- KEYS[1] record, KEYS[2] lease; ARGV: token, reason, retention ms
-- Returns 1 (OK) or 0 (LOST).
local f = redis.call('HMGET', KEYS[1], 'st', 'tok', 'ptok')
if f[2] ~= ARGV[1] then
  -- A retry of this fail, after another claim took the failed key over.
  if f[3] == ARGV[1] then return 1 end
  return 0
end
if f[1] == 'f' then return 1 end
if f[1] ~= 'p' then return 0 end
redis.call('HSET', KEYS[1], 'st', 'f', 'err', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('DEL', KEYS[2])
return 1
