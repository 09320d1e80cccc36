-- quorum_grant.lua: phase one of a Redlock acquisition on one node
-- (Node.Grant).
--
-- KEYS[1]  the lock key            P:{T}
-- KEYS[2]  the fencing counter     P:{T}:fence
-- KEYS[3]  the waiter queue        P:{T}:waiters
-- KEYS[4]  the receipts            P:{T}:rel
-- ARGV[1]  owner
-- ARGV[2]  ttl, ms
-- ARGV[3]  metadata json
-- ARGV[4]  wait id, "" when not waiting
-- ARGV[5]  the wait id's queue score (the same on every node, so every
--          node wakes the same waiter first)
-- ARGV[6]  the proposed token, decimal; "0" proposes none
-- ARGV[7]  the counter's retention, ms
-- ARGV[8]  the most, µs, a proposal may be ahead of the server's time
--
-- Returns {1, floor, recorded, now} when granted, where floor =
-- max(counter, now) before this grant, decimal, recorded is 1 when the
-- lease holds the proposed token, and now is the server time in µs,
-- decimal; else {0, the key's value, ms left on the lease or
-- reservation}.
--
-- A free key gets the lease "<owner>|<token>|<metadata>", PX ttl. The
-- token is the proposal when it is above the floor and at most ARGV[8]
-- ahead of the server's time: the counter is then raised to it here, as
-- a commit would (quorum_commit.lua). Otherwise it is 0, and a commit
-- writes the quorum token in later. A proposal of 2^53 or more, or one
-- without a positive retention, is an error before anything is written.
-- A lease already held by the same owner (the same attempt executed
-- twice: the client retried a request whose reply was lost) is granted
-- again and left as it is (a commit may have recorded the token in it
-- already; its expiry stays the one the attempt counted from); it counts
-- as recorded when it holds the proposal. A release marker ("|<token>", with or without a
-- reservation that has ended) counts as free; its token goes to the
-- receipts when the grant overwrites it.
local p = 0
if string.match(ARGV[6], '^%d+$') then p = tonumber(ARGV[6]) end
if not string.match(ARGV[6], '^%d+$') or p >= 9007199254740992 or
   (p > 0 and not (string.match(ARGV[7], '^%d+$') and tonumber(ARGV[7]) > 0
                   and string.match(ARGV[8], '^%d+$'))) then
  return redis.error_reply('ERR quorum_grant: bad proposal ' .. ARGV[6] .. ', retention ' .. tostring(ARGV[7]) .. ' or lead ' .. tostring(ARGV[8]))
end
local cur = redis.call('GET', KEYS[1])
local pttl = 0
local mine = cur and string.sub(cur, 1, #ARGV[1] + 1) == ARGV[1] .. '|'
if cur and string.sub(cur, 1, 1) == '|' then
  pttl = reserved_left(cur, ARGV[4]) -- a release marker: free unless reserved
elseif cur and not mine then
  pttl = redis.call('PTTL', KEYS[1]) -- held by someone else
end
if pttl ~= 0 then
  queue_waiter(KEYS[3], ARGV[4], ARGV[5], pttl)
  return {0, cur, pttl}
end
if ARGV[4] ~= '' then
  redis.call('ZREM', KEYS[3], ARGV[4])
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local c = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if c < now then c = now end
local recorded = 0
if mine then
  if p > 0 and tonumber(string.match(cur, '^[^|]*|(%d+)|')) == p then
    recorded = 1
  end
else
  take_marker(cur, KEYS[4])
  local tok = '0'
  if p > c and p <= now + (tonumber(ARGV[8]) or 0) then
    tok = ARGV[6]
    redis.call('SET', KEYS[2], tok, 'PX', ARGV[7])
    recorded = 1
  end
  redis.call('SET', KEYS[1], ARGV[1] .. '|' .. tok .. '|' .. ARGV[3], 'PX', ARGV[2])
end
return {1, string.format('%.0f', c), recorded, string.format('%.0f', now)}
