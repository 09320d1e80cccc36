-- acquire.lua: the single-deployment acquisition (Node.Acquire).
--
-- KEYS[1]  the lock key            P:{T}
-- KEYS[2]  the waiter queue        P:{T}:waiters
-- KEYS[3]  the receipts            P:{T}:rel
-- ARGV[1]  owner
-- ARGV[2]  ttl, ms
-- ARGV[3]  metadata json
-- ARGV[4]  wait id, "" when not waiting
-- ARGV[5]  the wait id's queue score (µs)
--
-- Returns {1, token} when granted (token decimal), else
-- {0, the key's value, ms left on the lease or reservation}.
--
-- A free key gets the lease "<owner>|<token>|<metadata>", PX ttl. The token
-- is the release marker's token + 1, or, when there is no marker (first
-- use, expiry without release, a restart that lost it), the server time in
-- µs: tokens increase on every acquisition, and after a restart still
-- start above every earlier token unless the server clock went back.
-- Tokens are formatted with %.0f: Lua numbers are doubles, exact for
-- integers below 2^53 (µs timestamps stay below that until the year 2255).
--
-- A lease already held by ARGV[1] is granted again, unchanged (same token,
-- same expiry): owners are fresh per attempt, so that is this very attempt,
-- executed twice because the client retried a request whose reply was
-- lost.
--
-- A waiter whose attempt fails is added to the key's waiter queue, so the
-- release can wake exactly one waiter (see release.lua). While a release
-- marker reserves the key for the waiter it woke ("|<token>|<wait id>|<until
-- ms>"), everyone else is refused until the reservation ends.
--
-- An acquisition that overwrites a release marker records the marker's
-- token in the key's receipts (see release.lua).
local v = redis.call('GET', KEYS[1])
local last = 0
if v then
  if string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. '|' then
    if ARGV[4] ~= '' then
      redis.call('ZREM', KEYS[2], ARGV[4])
    end
    return {1, string.match(v, '^[^|]*|(%d+)') or '0'}
  end
  local pttl = 0
  if string.find(v, '|', 1, true) ~= 1 then
    pttl = redis.call('PTTL', KEYS[1]) -- held
  else
    pttl = reserved_left(v, ARGV[4]) -- a release marker
    last = tonumber(string.match(v, '^|(%d+)')) or 0
  end
  if pttl ~= 0 then
    queue_waiter(KEYS[2], ARGV[4], ARGV[5], pttl)
    return {0, v, pttl}
  end
end
local tok = last + 1
if last == 0 then
  local t = redis.call('TIME')
  local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
  if tok < floor then tok = floor end
end
tok = string.format('%.0f', tok)
take_marker(v, KEYS[3])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. tok .. '|' .. ARGV[3], 'PX', ARGV[2])
if ARGV[4] ~= '' then
  redis.call('ZREM', KEYS[2], ARGV[4])
end
return {1, tok}
