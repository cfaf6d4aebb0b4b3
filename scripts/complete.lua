-- complete: pending -> completed with the result, for the owner only.
-- KEYS[1] record, KEYS[2] lease; ARGV: token, result, retention ms
-- Returns 1 (OK) or 0 (LOST).
local f = redis.call('HMGET', KEYS[1], 'st', 'tok')
if f[2] ~= ARGV[1] then return 0 end
if f[1] == 'c' then return 1 end
if f[1] ~= 'p' then return 0 end
redis.call('HSET', KEYS[1], 'st', 'c', 'res', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('DEL', KEYS[2])
return 1
