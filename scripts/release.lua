-- release: undo the owner's claim, as if it had never been made.
-- A first attempt removes the record; a later one returns it to failed with
-- the attempt uncounted, so the fence still only grows.
-- KEYS[1] record, KEYS[2] lease; ARGV: token
-- Returns 1 (OK) or 0 (LOST).
local f = redis.call('HMGET', KEYS[1], 'st', 'tok', 'att', 'ptok')
if not f[1] then return 1 end
if f[2] ~= ARGV[1] then
  -- A retry of this release, after another claim took the key over.
  if f[4] == ARGV[1] then return 1 end
  return 0
end
if f[1] == 'f' then return 1 end
if f[1] ~= 'p' then return 0 end
local att = tonumber(f[3])
if att <= 1 then
  redis.call('DEL', KEYS[1])
  -- Leave the releasing token where the next claim finds it (see claim.lua).
  redis.call('SET', KEYS[2], '~' .. ARGV[1], 'PX', 60000)
else
  redis.call('HSET', KEYS[1], 'st', 'f', 'att', att - 1)
  redis.call('DEL', KEYS[2])
end
return 1
