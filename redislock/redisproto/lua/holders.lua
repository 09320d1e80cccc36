-- holders.lua: a group's live holders (Node.List).
--
-- KEYS[1]  the lock key            P:{T}
-- KEYS[2]  the group's holders     P:{T}:h
-- KEYS[3]  the group's holder data P:{T}:hd
-- ARGV[1]  none: the script takes no arguments
--
-- Returns {the key's value, holders} (see group_holders) when a group
-- holds the key, else {the key's value or "", {}}. It removes holders
-- whose lease ended.
local v = redis.call('GET', KEYS[1])
if not is_group(v) then
  return {v or '', {}}
end
local hs = group_holders(KEYS[2], KEYS[3], now_ms())
return {v, hs}
