-- refresh_group.lua: compare-and-extend one shared or limited holder's
-- lease (Node.Refresh, Node.RefreshBatch of a group lease).
--
-- KEYS[1]  the lock key            P:{T}
-- KEYS[2]  the group's holders     P:{T}:h
-- KEYS[3]  the group's holder data P:{T}:hd
-- ARGV[1]  owner
-- ARGV[2]  ttl, ms
--
-- Returns 1 when the lease was extended to ttl from now, 0 when owner is
-- not a live holder (its lease ended or was released, or the key holds
-- something else). The group's keys expire with its latest holder.
local v = redis.call('GET', KEYS[1])
if not is_group(v) then
  return 0
end
local now = now_ms()
local sc = redis.call('ZSCORE', KEYS[2], ARGV[1])
if not sc or tonumber(sc) <= now then
  return 0
end
redis.call('ZADD', KEYS[2], 'XX', string.format('%.0f', now + tonumber(ARGV[2])), ARGV[1])
group_expire(KEYS[1], KEYS[2], KEYS[3])
return 1
