-- extend: push the owner's lease out to lease ms from now.
-- KEYS[1] the record; ARGV: token (encoded), lease ms
-- Returns 1 (OK) or 0 (LOST).
local v = redis.pcall('GET', KEYS[1])
local bad, st, rcv, fence, att, fp, tp, tok, pp, ep, bp, ret, kp, rp = decode(v)
if bad then return corrupt(bad) end
if not v or st ~= 'p' or tok ~= ARGV[1] then return 0 end
redis.call('PEXPIRE', KEYS[1], string.format('%d', ret + tonumber(ARGV[2])))
return 1
