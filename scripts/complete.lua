-- complete: pending -> completed with the result, for the owner only.
-- KEYS[1] the record; ARGV: token (encoded), result, retention ms
-- Returns 1 (OK) or 0 (LOST).
if bad then return corrupt(bad) end
if not v or st == 'r' or tok ~= ARGV[1] then return 0 end
if st == 'c' then return 1 end
if st ~= 'p' then return 0 end
local res = ARGV[2]
redis.call('SET', KEYS[1], '\1' .. state('c') .. sub(v, 3, bp - 1) .. uvenc(#res) .. res, 'PX', ARGV[3])
return 1
