-- step: record a recovery point (a step's result) for the owner of a
-- pending record, after the steps it already holds.
-- KEYS[1] the record
-- ARGV: token (encoded), index (how many steps come before this one), the
--   step encoded as the record keeps it (uvarint length + name, uvarint
--   length + result)
-- Returns 1 (OK: recorded, or already recorded byte for byte by the
-- holder: this call sent again), 0 (LOST: the caller does not hold a
-- pending record, whatever steps it holds), or
-- {2, steps held, the name held at index or ''} (ORDER: the record holds
-- another number of steps, or another step at index).
local v = redis.pcall('GET', KEYS[1])
local bad, st, rcv, fence, att, fp, tp, tok, pp, ep, bp, ret, kp, rp, sp, ns = decode(v)
if bad then return corrupt(bad) end
if not v then return 0 end
-- Only the holder is answered OK, even for a step the record holds byte
-- for byte: one that another holder stored would otherwise read, to a
-- holder whose lease moved on, as its own (a step that gates an effect,
-- holding a value any holder would store, let it through).
if st ~= 'p' or tok ~= ARGV[1] then return 0 end
local idx, step = tonumber(ARGV[2]), ARGV[3]
ns = ns or 0
-- The step at idx, if the record holds one: where it starts and ends.
local at, held
if idx < ns then
  local i, k = sp, nil
  for _ = 1, idx do
    k, i = uvar(v, i)
    k, i = uvar(v, i + k)
    i = i + k
  end
  local n1, j = uvar(v, i)
  local n2, r = uvar(v, j + n1)
  at, held = sub(v, i, r + n2 - 1), sub(v, j, j + n1 - 1)
  -- This step, recorded already: a retry of this call (go-redis resends a
  -- script whose reply was lost).
  if at == step then return 1 end
end
if idx ~= ns then return {2, ns, held or ''} end
if ns == 0 then v = '\2' .. sub(v, 2) end
redis.call('SET', KEYS[1], v .. step, 'KEEPTTL')
return 1
