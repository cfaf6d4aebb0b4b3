-- record.lua: the format of an idemguard record, shared by every script
-- (scripts.go puts it in each: in front, or where a script marks its place);
-- guard/record.go is its Go twin.
-- One Redis string per key:
--
--   version      1 byte, 1
--   state        1 byte: p pending, c completed, f failed, r released (a
--                first attempt undone by release: the key reads as absent);
--                upper case P, C, F: the same, reached by recovering an
--                expired lease
--   fence        uvarint, 1 .. 2^53-1
--   attempt      uvarint, 1 .. 2^53-1
--   fingerprint  kind byte 0..16: that many bytes of the fingerprint itself;
--                255: 16 bytes of its SHA-256 (computed by the client)
--   token        kind byte 1..239: that many bytes; 255: 17 bytes, a
--                26-character base32 token packed by the client
--   ptok         the holder that ended its claim by fail or release before
--                this one took over: 0 for none, else as token
--   last error   uvarint length, bytes
--   body         p: uvarint retention ms, then uvarint length + scope,
--                   uvarint length + id
--                f: uvarint length + scope, uvarint length + id
--                c: uvarint length + result
--                r: nothing
--   steps        version 2 only, pending and failed records only: one or
--                more recovery points, each uvarint length + name (1..64
--                bytes), uvarint length + result, in the order they were
--                recorded. A record without steps is version 1, so keys
--                that use no steps keep the layout above byte for byte; a
--                completed record never keeps steps.
--
-- uvarint: 7 bits a byte, least significant first, high bit set on every
-- byte but the last, at most 8 bytes, no needless trailing zero byte.
-- Integers stay below 2^53, where Lua's doubles count exactly. The value
-- ends where its body ends. Anything else is corrupt: the scripts answer
-- an error reply starting IDEMGUARD_CORRUPT and change nothing.
--
-- A pending record's key lives for retention + lease; the lease left is
-- its PTTL minus the retention written in its body, so the server's own
-- clock judges it.

local MAXN = 9007199254740991 -- 2^53 - 1: the largest fence and attempt
local NONE = '\0' -- ptok of a record no earlier holder ended
local byte, sub = string.byte, string.sub

-- uvar reads a uvarint at i: the value and the index after it, or nil.
local function uvar(v, i)
  local b = byte(v, i)
  if not b then return nil end
  if b < 128 then return b, i + 1 end
  local n, mul = b - 128, 128
  for k = 1, 7 do
    b = byte(v, i + k)
    if not b then return nil end
    if b < 128 then
      if b == 0 then return nil end -- not minimal
      n = n + b * mul
      if n > MAXN then return nil end
      return n, i + k + 1
    end
    n = n + (b - 128) * mul
    mul = mul * 128
  end
  return nil
end

local function uvenc(n)
  if n < 128 then return string.char(n) end
  if n < 16384 then return string.char(n % 128 + 128, math.floor(n / 128)) end
  local t = {}
  while n >= 128 do
    t[#t + 1] = n % 128 + 128
    n = math.floor(n / 128)
  end
  t[#t + 1] = n
  return string.char(unpack(t))
end

-- decode reads a record value v, as redis.pcall('GET') gives it, into
-- plain values (a table or more closures would cost Redis time on each
-- call):
--   bad    nil, or what is wrong with v: the script must then answer
--          corrupt(bad) and change nothing
--   st     'p', 'c', 'f' or 'r' (nil when v is false: no record);
--   rcv    reached by recovering a lease
--   fence, att
--   where the fields lie in v: fingerprint fp..tp-1, token tp..pp-1
--   (tok: the token as stored), ptok pp..ep-1, last error (length and
--   bytes) ep..bp-1, body bp..#v; ret: a pending record's retention ms;
--   kp: where a pending or failed record's key starts; rp: where a
--   completed record's result starts; sp: where the steps start and ns
--   how many there are (nil for a record without steps).
-- Each script starts:
--   local v = redis.pcall('GET', KEYS[1])
--   local bad, st, rcv, fence, att, fp, tp, tok, pp, ep, bp, ret, kp, rp = decode(v)
-- (and adds sp, ns when it needs the steps).
local function decode(v)
  if not v then return nil end
  if type(v) ~= 'string' then return 'not a string' end
  local st, rcv, fence, att, fp, tp, tok, pp, ep, bp, ret, kp, rp
  local n = #v
  if n == 0 then return 'empty value' end
  local ver, s, i, k, k2 = byte(v, 1, 3)
  if ver ~= 1 and ver ~= 2 then return 'unknown version' end
  if s == 99 then st = 'c' elseif s == 112 then st = 'p' elseif s == 102 then st = 'f'
  elseif s == 114 then st = 'r' elseif s == 67 then st, rcv = 'c', true
  elseif s == 80 then st, rcv = 'p', true elseif s == 70 then st, rcv = 'f', true
  else return 'unknown state' end
  if i and i < 128 then fence, i = i, 4 else fence, i = uvar(v, 3) end
  if not fence or fence < 1 then return 'fence out of range' end
  att = byte(v, i)
  if att and att < 128 then i = i + 1 else att, i = uvar(v, i) end
  if not att or att < 1 then return 'attempts out of range' end
  -- fingerprint: kind 0..16, or 255 and a 16-byte digest
  fp = i
  k = byte(v, i)
  if k == 255 then k = 16 elseif not k or k > 16 then return 'bad fingerprint' end
  i = i + 1 + k
  if i - 1 > n then return 'bad fingerprint' end
  -- token: kind 1..239, or 255 and 17 packed bytes (the first at most 3)
  tp = i
  k, k2 = byte(v, i, i + 1)
  if k == 255 then
    if not k2 or k2 > 3 then return 'bad token' end
    k = 17
  elseif not k or k < 1 or k > 239 then return 'bad token' end
  i = i + 1 + k
  if i - 1 > n then return 'bad token' end
  tok = sub(v, tp, i - 1)
  -- ptok: 0 for none, else as a token
  pp = i
  k, k2 = byte(v, i, i + 1)
  if k == 255 then
    if not k2 or k2 > 3 then return 'bad previous token' end
    k = 17
  elseif not k or k > 239 then return 'bad previous token' end
  i = i + 1 + k
  if i - 1 > n then return 'bad previous token' end
  -- last error
  ep = i
  k = byte(v, i)
  if k and k < 128 then i = i + 1 else k, i = uvar(v, i) end
  if not k or i + k - 1 > n then return 'bad last error' end
  i = i + k
  bp = i
  if st == 'p' then
    ret, i = uvar(v, i)
    if not ret or ret < 1 then return 'retention out of range' end
  end
  if st == 'p' or st == 'f' then
    kp = i
    k, i = uvar(v, i)
    if k and i + k - 1 <= n then k, i = uvar(v, i + k) end
    if not k or i + k - 1 > n then return 'bad key' end
    i = i + k
  elseif st == 'c' then
    k, i = uvar(v, i)
    if not k or i + k - 1 > n then return 'completed without its result' end
    rp = i
    i = i + k
  end
  local sp, ns
  if ver == 2 then
    if st ~= 'p' and st ~= 'f' then return 'steps in a record that cannot hold them' end
    sp, ns = i, 0
    repeat
      k, i = uvar(v, i)
      if not k or k < 1 or k > 64 or i + k - 1 > n then return 'bad step' end
      k, i = uvar(v, i + k)
      if not k or i + k - 1 > n then return 'bad step' end
      i = i + k
      ns = ns + 1
    until i > n
  end
  if i ~= n + 1 then return 'trailing bytes' end
  return nil, st, rcv, fence, att, fp, tp, tok, pp, ep, bp, ret, kp, rp, sp, ns
end

-- corrupt is the error reply for a value that cannot be read.
local function corrupt(why)
  return redis.error_reply('IDEMGUARD_CORRUPT ' .. why .. ' at ' .. KEYS[1])
end

-- head writes the start of a record value: version, state (upper case if
-- recovered), fence, attempt.
local function head(s, recovered, f, a)
  if recovered then s = string.upper(s) end
  return '\1' .. s .. uvenc(f) .. uvenc(a)
end
