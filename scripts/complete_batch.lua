-- complete_batch: complete's fast path for several keys of one slot in
-- one script call. Per key i (KEYS[i], ARGV[3i-2..3i]): when the record is
-- the pending record this holder's claim wrote (ARGV[3i-2]), byte for
-- byte, it becomes the completed record ARGV[3i-1] for ARGV[3i] ms, as
-- complete.lua's first lines do.
-- Returns per key 1 (completed) or 0 (not on the fast path: the client
-- sends complete.lua for that key, which gives the answer). Running it
-- twice is safe: a record it completed no longer equals the pending one,
-- and complete.lua answers 1 for it.
-- The records are all read first, with one MGET: the keys are distinct
-- (the client groups no batch naming a key twice), and a key of another
-- type reads as nil, as a missing one (neither is on the fast path).
local r = {}
local vs = redis.pcall('MGET', unpack(KEYS))
for i = 1, #KEYS do
  local k = 3 * i
  local v = vs[i]
  if v == ARGV[k - 2] and not redis.pcall('SET', KEYS[i], ARGV[k - 1], 'PX', ARGV[k])['err'] then
    r[i] = 1
  else
    r[i] = 0
  end
end
return r
