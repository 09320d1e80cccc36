-- refresh.lua: compare-and-pexpire (Node.Refresh, Node.RefreshBatch).
--
-- KEYS[1]  the lock key            P:{T}
-- ARGV[1]  "<owner>|"
-- ARGV[2]  ttl, ms
--
-- Returns 1 when the lease was extended, 0 when owner does not hold it.
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
