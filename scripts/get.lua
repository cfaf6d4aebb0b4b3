-- get: the record's value and its time to live, read together; the client
-- decodes the value. It does not start with record.lua.
-- KEYS[1] the record
-- Returns {value or false, PTTL}.
local v = redis.pcall('GET', KEYS[1])
if type(v) == 'table' then return redis.error_reply('IDEMGUARD_CORRUPT not a string at ' .. KEYS[1]) end
return {v, redis.call('PTTL', KEYS[1])}
