-- quorum_release.lua: Redlock's release on one node (Node.QuorumRelease).
--
-- KEYS[1]  the lock key            P:{T}
-- KEYS[2]  the waiter queue        P:{T}:waiters
-- KEYS[3]  the receipts            P:{T}:rel
-- ARGV[1]  "<owner>|"
-- ARGV[2]  the waiters' channel prefix, P:{T}:w:
-- ARGV[3]  the reservation for the woken waiter, ms
-- ARGV[4]  the lease's quorum token, "" when unknown (an attempt that
--          failed before its commit)
-- ARGV[5]  the marker's retention, ms
-- ARGV[6]  "1" on a Cluster, else "0"
--
-- Returns {1, now} when released (now or already), {0, now} when owner
-- does not hold the key, where now is the server time in µs, decimal.
--
-- Like release.lua, it wakes the first queued waiter still listening and
-- reserves the key for it ("|<token>|<id>|<until>"); the quorum counter
-- lives in its own key. Waiters register on every node with the same
-- score, so every node wakes and reserves for the same waiter, which then
-- wins a majority instead of splitting the votes with the others. With a
-- token, the key keeps the marker "|<token>" (free for everyone, as
-- quorum_grant.lua reads it) for the retention, so that a retried release
-- recognises its own work and returns 1 again: by the marker, or, once a
-- grant took the marker over, by the token recorded in the receipts.
-- Without a token the key is deleted, or, when the release woke a waiter,
-- holds "|0|<id>|<until>" for the reservation.
local t = redis.call('TIME')
local now = string.format('%.0f', tonumber(t[1]) * 1000000 + tonumber(t[2]))
local v = redis.call('GET', KEYS[1])
if not (v and string.sub(v, 1, #ARGV[1]) == ARGV[1]) then
  if has_receipt(v, KEYS[3], ARGV[4]) then
    return {1, now} -- released already
  end
  return {0, now}
end
local turn = wake_one(KEYS[2], ARGV[2], ARGV[3], ARGV[6])
if ARGV[4] ~= '' then
  local marker = '|' .. ARGV[4]
  if turn then
    marker = marker .. '|' .. turn
  end
  redis.call('SET', KEYS[1], marker, 'PX', ARGV[5])
elseif turn then
  redis.call('SET', KEYS[1], '|0|' .. turn, 'PX', ARGV[3])
else
  redis.call('DEL', KEYS[1])
end
return {1, now}
