-- acquire_group.lua: a shared or limited acquisition (Node.AcquireGroup).
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
-- ARGV[6]  mode: "s" (shared) or "l" (limited)
-- ARGV[7]  the limit (limited), "0" (shared)
-- ARGV[8]  the waiters' channel prefix, P:{T}:w:
-- ARGV[9]  the reservation for a woken waiter, ms
-- ARGV[10] "1" on a Cluster, else "0"
--
-- Returns
--   {1, token}                            granted (token decimal)
--   {0, the key's value, ms left}         refused: an exclusive lease or a
--                                         reservation
--   {0, the key's value, ms left, holders}  refused: the group holding the
--                                         key has another mode, or all
--                                         the limit's permits
--   {2, the holders' limit}               refused: a limited request whose
--                                         limit is not the holders'
--   {3, ms left, holders}                 refused: a writer is waiting
--                                         (shared requests only)
-- where holders is the flat list of group_holders (owner, "<token>|<metadata>",
-- ms left, per holder).
--
-- A group's value is "*<mode>|<token>|<limit>" (see helpers.lua): each
-- grant takes the next token of the key's single counter: next_token of
-- the group's latest or the release marker's (0 on a key without either),
-- never below the server time in µs; it adds the holder to P:{T}:h (scored by its expiry)
-- and P:{T}:hd; the three keys expire with the latest holder. A holder
-- still recorded for ARGV[1] is this very attempt executed twice (a lost
-- reply): it is granted again, unchanged.
--
-- Writer preference: a shared request is refused while P:{T}:wr holds a
-- registration that has not expired (acquire.lua registers refused
-- writers). A reader refused so while the release marker reserves the key
-- for it passes the reservation on to the next queued waiter, so that the
-- writer behind it is not kept waiting by it.
--
-- A waiting reader (or a permit holder leaving permits free) that is
-- granted pokes the next queued waiter, which may be another reader. A
-- waiter refused by a semaphore with a free permit for its mode or limit
-- passes the wake-up on to the waiters queued after it (pass_permit).
local v = redis.call('GET', KEYS[1])
local now = now_ms()
local last = 0
local n = 0
if is_group(v) then
  local hs, most = group_holders(KEYS[4], KEYS[5], now)
  local d = redis.call('HGET', KEYS[5], ARGV[1])
  if d then
    if ARGV[4] ~= '' then
      redis.call('ZREM', KEYS[2], ARGV[4])
    end
    return {1, string.match(d, '^(%d+)')}
  end
  n = #hs / 3
  last = tonumber(string.match(v, '^[^|]*|(%d+)')) or 0
  if n > 0 then
    local mode, limit = string.match(v, '^%*(%a)|%d+|(%d+)')
    if mode == 'l' and ARGV[6] == 'l' and limit ~= ARGV[7] then
      pass_permit(v, n, KEYS[2], ARGV[8], ARGV[4], ARGV[10], KEYS[7])
      return {2, limit}
    end
    if mode ~= ARGV[6] or (mode == 'l' and n >= tonumber(limit)) then
      queue_waiter(KEYS[2], ARGV[4], ARGV[5], most)
      if mode ~= ARGV[6] then
        pass_permit(v, n, KEYS[2], ARGV[8], ARGV[4], ARGV[10], KEYS[7])
      end
      return {0, v, most, hs}
    end
    if ARGV[6] == 's' and live_writers(KEYS[6], now) > 0 then
      queue_waiter(KEYS[2], ARGV[4], ARGV[5], most)
      return {3, most, hs}
    end
  else
    redis.call('DEL', KEYS[4], KEYS[5]) -- every holder's lease ended
    -- The key outlives its last holder for up to a millisecond (Redis
    -- expires it by another clock reading than TIME): free, but a
    -- waiting writer still comes first.
    if ARGV[6] == 's' and live_writers(KEYS[6], now) > 0 then
      queue_waiter(KEYS[2], ARGV[4], ARGV[5], 0)
      return {3, 0, {}}
    end
  end
elseif v and string.find(v, '|', 1, true) ~= 1 then
  local pttl = redis.call('PTTL', KEYS[1]) -- an exclusive lease
  queue_waiter(KEYS[2], ARGV[4], ARGV[5], pttl)
  return {0, v, pttl}
else
  if v then
    local left = reserved_left(v, ARGV[4])
    if left > 0 then
      queue_waiter(KEYS[2], ARGV[4], ARGV[5], left)
      return {0, v, left}
    end
    last = tonumber(string.match(v, '^|(%d+)')) or 0
  end
  redis.call('DEL', KEYS[4], KEYS[5]) -- left over from a group whose key was lost
  if ARGV[6] == 's' and live_writers(KEYS[6], now) > 0 then
    if v and ARGV[4] ~= '' and string.match(v, '^|%d+|([^|]*)|') == ARGV[4] then
      -- reserved for this reader: hand the reservation to the next waiter
      -- that has not handed one on, and queue this reader again behind
      -- every such waiter (see wake_unhanded).
      local marker = '|' .. string.format('%.0f', last)
      local turn = wake_unhanded(KEYS[2], ARGV[8], ARGV[9], ARGV[10])
      if turn then
        marker = marker .. '|' .. turn
      end
      redis.call('SET', KEYS[1], marker, 'KEEPTTL')
      queue_waiter(KEYS[2], ARGV[4], string.format('%.0f', HANDED_ON + tonumber(ARGV[5])), 0)
      return {3, 0, {}}
    end
    queue_waiter(KEYS[2], ARGV[4], ARGV[5], 0)
    return {3, 0, {}}
  end
end
local tok = next_token(last)
if not is_group(v) then
  take_marker(v, KEYS[3])
end
local limit = '0'
if ARGV[6] == 'l' then limit = ARGV[7] end
redis.call('SET', KEYS[1], '*' .. ARGV[6] .. '|' .. tok .. '|' .. limit)
redis.call('ZADD', KEYS[4], string.format('%.0f', now + tonumber(ARGV[2])), ARGV[1])
redis.call('HSET', KEYS[5], ARGV[1], tok .. '|' .. ARGV[3])
group_expire(KEYS[1], KEYS[4], KEYS[5])
if ARGV[4] ~= '' then
  redis.call('ZREM', KEYS[2], ARGV[4])
  if ARGV[6] == 's' then
    poke_first(KEYS[2], ARGV[8])
  elseif n + 1 < tonumber(ARGV[7]) then
    poke_from(KEYS[2], ARGV[8], '', ARGV[10], KEYS[7])
  end
end
return {1, tok}
