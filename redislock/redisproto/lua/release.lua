-- release.lua: compare-and-release and wake one waiter (Node.Release).
--
-- KEYS[1]  the lock key            P:{T}
-- KEYS[2]  the waiter queue        P:{T}:waiters
-- KEYS[3]  the receipts            P:{T}:rel
-- ARGV[1]  "<owner>|"
-- ARGV[2]  the marker's retention, ms
-- ARGV[3]  the waiters' channel prefix, P:{T}:w:
-- ARGV[4]  the reservation for the woken waiter, ms
-- ARGV[5]  the lease's token, "" when unknown
-- ARGV[6]  "1" on a Cluster, else "0"
--
-- Returns 1 when released (now or already), 0 when owner does not hold
-- the key.
--
-- If owner holds the lock it publishes on the channel of the first queued
-- waiter that is still listening (PUBLISH counts receivers; departed
-- waiters are skipped; on a Cluster, the first queued waiter) and
-- replaces the value with the marker "|<token>", extended with that
-- waiter's id and a short reservation: the woken waiter gets the key even
-- if the releaser (or anyone else) asks again first, so waiters are served
-- in queue order and none is starved by barging.
--
-- A release that already took effect returns 1 again (a client retrying a
-- request whose reply was lost, or a second Release after an error). Its
-- receipt says so: the marker "|<token>" it left, and, once an acquisition
-- overwrote the marker, the token recorded in the receipt list (the last
-- RECEIPTS markers taken over, kept RECEIPT_RETENTION_MS after the latest).
-- Tokens of a key strictly increase, so a token names one lease; a marker
-- is written only by the release of that lease. The next acquisition's
-- token being ARGV[5] + 1 says so too, for markers taken over by a dlock
-- that keeps no receipts (its next token is the marker's + 1; ours is the
-- marker's + 1 only while the server clock is behind it, else the clock
-- in µs: only our marker yields ARGV[5] + 1 unless the clock read that).
local v = redis.call('GET', KEYS[1])
if not (v and string.sub(v, 1, #ARGV[1]) == ARGV[1]) then
  if v and ARGV[5] ~= '' then
    local t = tonumber(string.match(v, '^[^|]*|(%d+)'))
    if t == tonumber(ARGV[5]) + 1 then
      return 1 -- the next holder took over our marker: released already
    end
  end
  if has_receipt(v, KEYS[3], ARGV[5]) then
    return 1 -- released already
  end
  return 0
end
local marker = '|' .. (string.match(string.sub(v, #ARGV[1] + 1), '^(%d+)') or '0')
local turn = wake_one(KEYS[2], ARGV[3], ARGV[4], ARGV[6])
if turn then
  marker = marker .. '|' .. turn
end
redis.call('SET', KEYS[1], marker, 'PX', ARGV[2])
return 1
