-- break.lua: an operator's break of a lock (Node.Break, dlock.Break).
--
-- KEYS[1]  the lock key            P:{T}
-- KEYS[2]  the waiter queue        P:{T}:waiters
-- KEYS[3]  the group's holders     P:{T}:h
-- KEYS[4]  the group's holder data P:{T}:hd
-- KEYS[5]  the waiter last told of a free permit P:{T}:pk
-- ARGV[1]  the owner to remove, "" for every holder (a forced break)
-- ARGV[2]  the marker's retention, ms
-- ARGV[3]  the waiters' channel prefix, P:{T}:w:
-- ARGV[4]  the reservation for the woken waiter, ms
-- ARGV[5]  "1" on a Cluster, else "0"
-- ARGV[6]  "1" on a Redlock node (Node.QuorumBreak), else "0" or absent
-- ARGV[7]  this break's id (random, per call), "" or absent for none
-- ARGV[8]  how long the break's receipt is kept, ms
-- ARGV[9]  the break notice channel P:{T}:b, "" or absent for none
-- KEYS[6]  the break's receipt     P:{T}:brk:<ARGV[7]> (with an id)
--
-- Returns {the key's value or "", removed, others}: removed are the
-- leases removed, others (only when ARGV[1] names an owner that holds
-- nothing) the holders left in place, each list flat as group_holders
-- returns it (owner, "<token>|<metadata>", ms left). A free key (no value,
-- a release marker, a group whose leases all ended) removes nothing.
--
-- An exclusive lease, or a group's last holder, is replaced with a release
-- marker, and one waiter is woken and reserved for as release.lua does.
-- The marker's token is the lease's (the group's latest) token + 2: the
-- counter goes on from above it, so the next token is higher, and no
-- receipt names a broken lease. A release marker or receipt naming the
-- broken lease's token, or a marker one above it, would make that
-- holder's later Release report success (see release.lua); +2 is the
-- smallest step that names neither. A group holder's removal leaves no
-- receipt for the same reason, and when others stay, the group's latest
-- token goes one up, so that their last release's marker does not name
-- the removed holder's token. Waiting writers' registrations and queued
-- waiters stay. On a Redlock node, whose tokens come from the counter
-- P:{T}:fence (untouched here), the marker carries no token, as a
-- release's without one (quorum_release.lua): "|0|<id>|<until>" while it
-- reserves the key for the woken waiter, else the key is deleted.
--
-- A break that removed something publishes "1" on the break notice
-- channel (ARGV[9]), which the holders' clients listen on: each checks
-- at once whether its lease is still there, instead of at its next
-- renewal.
--
-- A break that removed something leaves a receipt (KEYS[6], for ARGV[8]
-- ms): its reply, as JSON. The same break run again (a client retrying a
-- request whose reply was lost) returns that reply instead of reading
-- the key it already broke, which it would report as free, or an
-- owner-checked break as "not the holder" (a break whose reply was lost).
local brk = ARGV[7] or ''
if brk ~= '' then
  local rec = redis.call('GET', KEYS[6])
  if rec then
    return cjson.decode(rec)
  end
end
local function done(res)
  if (ARGV[9] or '') ~= '' then
    redis.call('PUBLISH', ARGV[9], '1')
  end
  if brk ~= '' then
    redis.call('SET', KEYS[6], cjson.encode(res), 'PX', ARGV[8])
  end
  return res
end
local v = redis.call('GET', KEYS[1])
if not v or string.sub(v, 1, 1) == '|' then
  return {v or '', {}, {}}
end
local removed, others = {}, {}
local function put(list, o, d, ms)
  list[#list + 1] = o
  list[#list + 1] = d
  list[#list + 1] = ms
end
local function mark(tok)
  if ARGV[6] == '1' then
    local turn = wake_one(KEYS[2], ARGV[3], ARGV[4], ARGV[5])
    if turn then
      redis.call('SET', KEYS[1], '|0|' .. turn, 'PX', ARGV[4])
    else
      redis.call('DEL', KEYS[1])
    end
    return
  end
  local n = tonumber(tok)
  if not n then
    redis.call('DEL', KEYS[1]) -- no token to go on from: the next grant uses the clock
    return
  end
  local marker = '|' .. string.format('%.0f', n + 2)
  local turn = wake_one(KEYS[2], ARGV[3], ARGV[4], ARGV[5])
  if turn then
    marker = marker .. '|' .. turn
  end
  redis.call('SET', KEYS[1], marker, 'PX', ARGV[2])
end
if is_group(v) then
  local hs = group_holders(KEYS[3], KEYS[4], now_ms())
  if #hs == 0 then
    return {v, {}, {}}
  end
  for i = 1, #hs, 3 do
    if ARGV[1] == '' or hs[i] == ARGV[1] then
      put(removed, hs[i], hs[i + 1], hs[i + 2])
    else
      put(others, hs[i], hs[i + 1], hs[i + 2])
    end
  end
  if #removed == 0 then
    return {v, {}, others}
  end
  for i = 1, #removed, 3 do
    redis.call('ZREM', KEYS[3], removed[i])
    redis.call('HDEL', KEYS[4], removed[i])
  end
  if redis.call('ZCARD', KEYS[3]) == 0 then
    redis.call('DEL', KEYS[3], KEYS[4])
    mark(string.match(v, '^[^|]*|(%d+)'))
  else
    -- Others stay. The group's latest token goes one up: the removed
    -- holder may have had it, and the last release's marker carries it
    -- (then the receipts, once a grant takes the marker over), which
    -- would make that holder's Release report success
    -- (when the removed holder was the latest). No holder has the new token.
    local m, tok, rest = string.match(v, '^(%*%a)|(%d+)|(.*)$')
    if tok then
      redis.call('SET', KEYS[1], m .. '|' .. string.format('%.0f', tonumber(tok) + 1) .. '|' .. rest, 'KEEPTTL')
    end
    group_expire(KEYS[1], KEYS[3], KEYS[4])
    if string.sub(v, 2, 2) == 'l' then
      poke_from(KEYS[2], ARGV[3], '', ARGV[5], KEYS[5])
    end
  end
  return done({v, removed, {}})
end
local o, rest = string.match(v, '^([^|]*)|(.*)$')
if not o then
  o, rest = '', v
end
local ms = string.format('%.0f', math.max(redis.call('PTTL', KEYS[1]), 0))
if ARGV[1] ~= '' and o ~= ARGV[1] then
  put(others, o, rest, ms)
  return {v, {}, others}
end
put(removed, o, rest, ms)
mark(string.match(rest, '^(%d+)|'))
return done({v, removed, {}})
