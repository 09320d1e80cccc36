-- release_fast.lua: the release of an uncontended lease
-- (Node.ReleaseFast): release.lua's branch for a lease of this owner
-- with no waiter queued, with 2 keys and 2 arguments instead of 3 and 6.
--
-- KEYS[1]  the lock key            P:{T}
-- KEYS[2]  the waiter queue        P:{T}:waiters
-- ARGV[1]  "<owner>|"
-- ARGV[2]  the marker's retention, ms
--
-- Returns 1 when released, and 2 for any other state (waiters queued,
-- or the key no longer holds this owner's lease: released already, by a
-- request whose reply was lost, or lost): the caller then runs
-- release.lua, which answers.
local v = redis.call('GET', KEYS[1])
if not (v and string.sub(v, 1, #ARGV[1]) == ARGV[1]) then
  return 2
end
if redis.call('EXISTS', KEYS[2]) == 1 then
  return 2
end
redis.call('SET', KEYS[1], '|' .. (string.match(string.sub(v, #ARGV[1] + 1), '^(%d+)') or '0'), 'PX', ARGV[2])
return 1
