-- extend: push the owner's lease out.
-- KEYS[1] record, KEYS[2] lease; ARGV: token, lease ms
-- Returns 1 (OK) or 0 (LOST).
local f = redis.call('HMGET', KEYS[1], 'st', 'tok')
if f[1] ~= 'p' or f[2] ~= ARGV[1] then return 0 end
local lease_ms = tonumber(ARGV[2])
redis.call('SET', KEYS[2], ARGV[1], 'PX', lease_ms)
if redis.call('PTTL', KEYS[1]) < lease_ms then
  redis.call('PEXPIRE', KEYS[1], lease_ms)
end
return 1
