-- acquire.lua: the single-deployment acquisition (Node.Acquire).
--
-- KEYS[1]  the lock key            P:{T}
-- KEYS[2]  the waiter queue        P:{T}:waiters
-- KEYS[3]  the receipts            P:{T}:rel
-- KEYS[4]  the group's holders     P:{T}:h
-- KEYS[5]  the group's holder data P:{T}:hd
-- KEYS[6]  the waiting writers     P:{T}:wr
-- KEYS[7]  the waiter last told of a free permit P:{T}:pk
-- ARGV[1]  owner
-- ARGV[2]  ttl, ms
-- ARGV[3]  metadata json
-- ARGV[4]  wait id, "" when not waiting
-- ARGV[5]  the wait id's queue score (µs)
-- ARGV[6]  the blocking Acquire's waiter id (Request.Waiter), "" for
--          TryAcquire
-- ARGV[7]  the waiters' channel prefix, P:{T}:w:
-- ARGV[8]  "1" on a Cluster, else "0"
--
-- Returns {1, token} when granted (token decimal), else
-- {0, the key's value, ms left on the lease or reservation} and, when
-- shared or limited holders hold the key, a fourth element: their list
-- (see group_holders).
--
-- A refused attempt with a waiter id registers it as a waiting writer
-- (P:{T}:wr, scored by the end of the registration: ttl after the
-- attempt), which keeps new shared holders out (writer preference); the
-- grant removes it, and so does leave.lua.
--
-- A free key gets the lease "<owner>|<token>|<metadata>", PX ttl. The token
-- is next_token(last): the larger of the release marker's token + 1 (0 + 1
-- when there is no marker: first use, expiry without release, a restart
-- or failover that lost it) and the server time in µs. Tokens increase on
-- every acquisition, and after a restart or a failover to a replica that
-- missed the latest writes they still start above every earlier token
-- unless the server clock is behind the one that issued them by more than
-- the interruption took.
--
-- A lease already held by ARGV[1] is granted again, unchanged (same token,
-- same expiry): owners are fresh per attempt, so that is this very attempt,
-- executed twice because the client retried a request whose reply was
-- lost.
--
-- A waiter whose attempt fails is added to the key's waiter queue, so the
-- release can wake exactly one waiter (see release.lua). While a release
-- marker reserves the key for the waiter it woke ("|<token>|<wait id>|<until
-- ms>"), everyone else is refused until the reservation ends.
--
-- An acquisition that overwrites a release marker records the marker's
-- token in the key's receipts (see release.lua).
--
-- A waiter refused by a semaphore that has a free permit passes the
-- wake-up on to the waiters queued after it (pass_permit): a permit's
-- release pokes the first queued waiter, which may be this one.
local v = redis.call('GET', KEYS[1])
local last = 0
local waiter = ARGV[6] or '' -- absent: a caller of protocol 2 before writer preference
if v then
  if string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. '|' then
    if ARGV[4] ~= '' then
      redis.call('ZREM', KEYS[2], ARGV[4])
    end
    if waiter ~= '' then
      redis.call('ZREM', KEYS[6], waiter)
    end
    return {1, string.match(v, '^[^|]*|(%d+)') or '0'}
  end
  local pttl = 0
  if is_group(v) then
    local hs, most = group_holders(KEYS[4], KEYS[5], now_ms())
    if #hs > 0 then
      queue_waiter(KEYS[2], ARGV[4], ARGV[5], most)
      register_writer(KEYS[6], waiter, ARGV[2])
      pass_permit(v, #hs / 3, KEYS[2], ARGV[7], ARGV[4], ARGV[8], KEYS[7])
      return {0, v, most, hs}
    end
    last = tonumber(string.match(v, '^[^|]*|(%d+)')) or 0 -- every holder's lease ended
    redis.call('DEL', KEYS[4], KEYS[5])
  elseif string.find(v, '|', 1, true) ~= 1 then
    pttl = redis.call('PTTL', KEYS[1]) -- held
  else
    pttl = reserved_left(v, ARGV[4]) -- a release marker
    last = tonumber(string.match(v, '^|(%d+)')) or 0
  end
  if pttl ~= 0 then
    queue_waiter(KEYS[2], ARGV[4], ARGV[5], pttl)
    register_writer(KEYS[6], waiter, ARGV[2])
    return {0, v, pttl}
  end
end
local tok = next_token(last)
take_marker(v, KEYS[3])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. tok .. '|' .. ARGV[3], 'PX', ARGV[2])
if ARGV[4] ~= '' then
  redis.call('ZREM', KEYS[2], ARGV[4])
end
if waiter ~= '' then
  redis.call('ZREM', KEYS[6], waiter)
end
return {1, tok}
