-- held.lua: whether an owner still holds a key (Node.HoldsAll, after a
-- break notice). A script, not a GET: a client that routes reads to
-- replicas (a Cluster client with ReadOnly or RouteByLatency) still
-- asks the primary, which a lease just granted has reached.
--
-- KEYS[1]  the lock key            P:{T}
-- KEYS[2]  the group's holders     P:{T}:h
-- ARGV[1]  owner
-- ARGV[2]  "1" for a shared or limited holder, else "0"
--
-- Returns 1 when owner holds the key, else 0.
if ARGV[2] == '1' then
  if redis.call('ZSCORE', KEYS[2], ARGV[1]) then
    return 1
  end
  return 0
end
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. '|' then
  return 1
end
return 0
