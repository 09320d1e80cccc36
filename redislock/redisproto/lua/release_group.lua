-- release_group.lua: compare-and-release one shared or limited holder
-- (Node.ReleaseGroup).
--
-- KEYS[1]  the lock key            P:{T}
-- KEYS[2]  the waiter queue        P:{T}:waiters
-- KEYS[3]  the receipts            P:{T}:rel
-- KEYS[4]  the group's holders     P:{T}:h
-- KEYS[5]  the group's holder data P:{T}:hd
-- KEYS[6]  the waiter last told of a free permit P:{T}:pk
-- ARGV[1]  owner
-- ARGV[2]  the marker's retention, ms
-- ARGV[3]  the waiters' channel prefix, P:{T}:w:
-- ARGV[4]  the reservation for the woken waiter, ms
-- ARGV[5]  the lease's token, "" when unknown
-- ARGV[6]  "1" on a Cluster, else "0"
--
-- Returns 1 when released (now or already), 0 when owner is not a live
-- holder.
--
-- The holder's token goes to the receipts (P:{T}:rel) at once, so that a
-- retry whose first reply was lost finds it there and reports success.
-- The last holder's release replaces the group's value with the release
-- marker "|<token>" (the group's latest token), and wakes and reserves the
-- key for the first queued waiter, as release.lua does. A limited
-- holder's release that leaves others pokes the first queued waiter
-- listening, without dequeuing it (no reservation: the freed permit goes
-- to whoever asks first); one that cannot use the permit (a writer, a
-- reader, another limit) passes the word on to the next (pass_permit). A shared holder's release that leaves other readers wakes
-- nobody: a waiting writer needs the last one gone.
local v = redis.call('GET', KEYS[1])
if is_group(v) then
  local now = now_ms()
  local sc = redis.call('ZSCORE', KEYS[4], ARGV[1])
  if sc and tonumber(sc) > now then
    local d = redis.call('HGET', KEYS[5], ARGV[1]) or ''
    redis.call('ZREM', KEYS[4], ARGV[1])
    redis.call('HDEL', KEYS[5], ARGV[1])
    local tok = string.match(d, '^(%d+)')
    if tok then
      if redis.call('LPUSH', KEYS[3], tok) > 2 * RECEIPTS then
        redis.call('LTRIM', KEYS[3], 0, RECEIPTS - 1)
      end
      redis.call('PEXPIRE', KEYS[3], RECEIPT_RETENTION_MS)
    end
    purge_holders(KEYS[4], KEYS[5], now)
    if redis.call('ZCARD', KEYS[4]) == 0 then
      redis.call('DEL', KEYS[4], KEYS[5])
      local marker = '|' .. (string.match(v, '^[^|]*|(%d+)') or '0')
      local turn = wake_one(KEYS[2], ARGV[3], ARGV[4], ARGV[6])
      if turn then
        marker = marker .. '|' .. turn
      end
      redis.call('SET', KEYS[1], marker, 'PX', ARGV[2])
    else
      group_expire(KEYS[1], KEYS[4], KEYS[5])
      if string.sub(v, 2, 2) == 'l' then
        poke_from(KEYS[2], ARGV[3], '', ARGV[6], KEYS[6])
      end
    end
    return 1
  end
end
if ARGV[5] ~= '' then
  for _, t in ipairs(redis.call('LRANGE', KEYS[3], 0, RECEIPTS - 1)) do
    if t == ARGV[5] then return 1 end -- released already
  end
end
return 0
