-- acquire_fast.lua: the first attempt of an exclusive acquisition that is
-- not queued (Node.AcquireFast): acquire.lua's branches for a key with
-- no value or with a release marker that reserves it for nobody, with 2
-- keys and 3 arguments instead of 7 and 8.
--
-- KEYS[1]  the lock key            P:{T}
-- KEYS[2]  the receipts            P:{T}:rel
-- ARGV[1]  owner
-- ARGV[2]  ttl, ms
-- ARGV[3]  metadata json
-- ARGV[4]  "1" when a refusal registers nothing (TryAcquire: no waiter
--          id), else "0"
--
-- Returns {1, token} when granted (token decimal), as acquire.lua does
-- for these states; with ARGV[4] "1", {0, the key's value, ms left} for
-- a key another owner holds exclusively, as acquire.lua does for a
-- request without a wait id or a waiter; and {2} for any other state
-- (reserved, a group's, this very owner's lease: a request the client
-- sent again after a lost reply, or a held key whose refusal registers a
-- waiting writer): the caller then runs acquire.lua, which answers.
--
-- Nothing else needs doing on these branches for a first attempt: it
-- carries no wait id (not queued), and no attempt of its acquisition
-- registered its waiter as a waiting writer before it (this script never
-- registers one, so a retry of it neither).
local v = redis.call('GET', KEYS[1])
local last = 0
if v then
  local t = string.match(v, '^|(%d+)$')
  if not t then
    if ARGV[4] == '1' and string.find(v, '|', 1, true) ~= 1 and string.sub(v, 1, 1) ~= '*'
      and string.sub(v, 1, #ARGV[1] + 1) ~= ARGV[1] .. '|' then
      local pttl = redis.call('PTTL', KEYS[1])
      if pttl ~= 0 then
        return {0, v, pttl}
      end
    end
    return {2}
  end
  last = tonumber(t)
end
local tok = next_token(last)
take_marker(v, KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. tok .. '|' .. ARGV[3], 'PX', ARGV[2])
return {1, tok}
