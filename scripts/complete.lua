-- complete: pending -> completed with the result, for the owner only.
-- KEYS[1] the record
-- ARGV: token (encoded), retention ms, the pending record this holder's
--   claim wrote when the client knows it exactly (else ''), and the
--   completed record: whole when the pending one was given (else only its
--   body, the uvarint length and the result), with the length of what
--   comes before the body in it.
-- Returns 1 (OK) or 0 (LOST).
local v = redis.pcall('GET', KEYS[1])
-- The pending record the holder's claim left, as it left it: the
-- completed record is exactly what the general path below would write.
-- (Redis 8.4's SET IFEQ does this natively.)
if ARGV[3] ~= '' and v == ARGV[3] then
  redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[2])
  return 1
end
--[[record.lua]]
local bad, st, rcv, fence, att, fp, tp, tok, pp, ep, bp, ret, kp, rp = decode(v)
if bad then return corrupt(bad) end
if not v or st == 'r' or tok ~= ARGV[1] then return 0 end
if st == 'c' then return 1 end
if st ~= 'p' then return 0 end
redis.call('SET', KEYS[1], '\1' .. (rcv and 'C' or 'c') .. sub(v, 3, bp - 1) .. sub(ARGV[4], tonumber(ARGV[5]) + 1),
  'PX', ARGV[2])
return 1
