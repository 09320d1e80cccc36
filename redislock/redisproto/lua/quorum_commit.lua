-- quorum_commit.lua: phase two of a Redlock acquisition on one node
-- (Node.Commit).
--
-- KEYS[1]  the lock key            P:{T}
-- KEYS[2]  the fencing counter     P:{T}:fence
-- ARGV[1]  "<owner>|"
-- ARGV[2]  the quorum token, decimal
-- ARGV[3]  the lease's full value, "<owner>|<token>|<metadata>"
-- ARGV[4]  the counter's retention, ms
--
-- Returns 1 when committed, 0 when owner no longer holds the key.
--
-- If the owner still holds the lease it records the value (keeping the
-- TTL) and raises the counter to at least the token. Executed twice, it
-- does the same again.
local t = tonumber(ARGV[2])
if not t or t >= 9007199254740992 then
  error({err = 'DLOCKTOKEN the quorum token is 2^53 or more: it cannot be kept exactly'})
end
local v = redis.call('GET', KEYS[1])
if not (v and string.sub(v, 1, #ARGV[1]) == ARGV[1]) then
  return 0
end
redis.call('SET', KEYS[1], ARGV[3], 'KEEPTTL')
local c = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if c < t then c = t end
redis.call('SET', KEYS[2], string.format('%.0f', c), 'PX', ARGV[4])
return 1
