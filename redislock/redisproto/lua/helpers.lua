-- helpers.lua: functions shared by the scripts (not a script itself).
--
-- The Go loader (link in scripts.go) puts the helpers a script calls, and
-- the helpers those call, in front of the script's first line, flattened
-- to that one line (comments and newlines removed), so the line numbers
-- Redis reports in an error are the script file's own; an error inside a
-- helper is reported on line 1. A helper is a top-level
-- "local function NAME(...)" block, up to the next helper's comment or
-- definition, and may call only helpers defined above it.
--
-- RECEIPTS and RECEIPT_RETENTION_MS are not defined here: the loader
-- defines them, as locals, from the Go constants Receipts and
-- ReceiptRetention, for the helpers and scripts that name them.

-- now_ms(): the server's time in ms.
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- next_token(last): the token of a grant after the key's latest token
-- last (0 when unknown), formatted: max(last + 1, server time in µs).
-- The time floor applies to every grant, not only to a key without a
-- marker: a primary promoted after a failover may have missed the latest
-- grants and markers, and its clock still puts its tokens above theirs
-- unless it is behind the old primary's by more than the failover took.
-- %.0f: Lua numbers are doubles, exact for integers up to 2^53 (µs
-- timestamps stay below that until the year 2255). A last token of 2^53
-- or more (never issued by these scripts; written by hand or another
-- tool) is not read exactly and its + 1 not representable, so the next
-- token could repeat it or go back: the grant fails with the error
-- DLOCKTOKEN instead (the key stays unusable until that value goes).
local function next_token(last)
  if last >= 9007199254740992 then
    error({err = 'DLOCKTOKEN the key\'s last token is 2^53 or more: a next token above it cannot be computed exactly'})
  end
  local t = redis.call('TIME')
  local tok = math.max(last + 1, tonumber(t[1]) * 1000000 + tonumber(t[2]))
  return string.format('%.0f', tok)
end

-- reserved_left(v, wait_id): ms left on the reservation a release marker
-- v ("|<token>|<wait id>|<until ms>") holds for a waiter other than
-- wait_id; 0 when there is none.
local function reserved_left(v, wait_id)
  local wid, exp = string.match(v, '^|%d+|([^|]*)|(%d+)$')
  if not wid or wid == wait_id then return 0 end
  return math.max(tonumber(exp) - now_ms(), 0)
end

-- queue_waiter(waiters, id, score, pttl): queue waiter id (once) and keep
-- the queue a minute longer than the current lease or reservation.
local function queue_waiter(waiters, id, score, pttl)
  if id == '' then return end
  redis.call('ZADD', waiters, 'NX', score, id)
  redis.call('PEXPIRE', waiters, math.max(pttl, 0) + 60000)
end

-- wake_one(waiters, prefix, reserve_ms, cluster): pop queued waiters until
-- a PUBLISH on prefix..id reaches a listener (PUBLISH counts receivers, so
-- departed waiters are skipped, at most 16 per call) and return
-- "<id>|<until ms>", the reservation for that waiter; nil when no queued
-- waiter listens. On a Cluster (cluster == '1') PUBLISH reaches
-- subscribers on every node over the cluster bus but counts only this
-- node's, so a count of 0 proves nothing: the first queued waiter is
-- popped, told and reserved for whatever the count (a departed one costs
-- the next at most the reservation).
local function wake_one(waiters, prefix, reserve_ms, cluster)
  for i = 1, 16 do
    local w = redis.call('ZPOPMIN', waiters)
    if #w == 0 then return nil end
    if redis.call('PUBLISH', prefix .. w[1], '1') > 0 or cluster == '1' then
      return w[1] .. '|' .. string.format('%.0f', now_ms() + tonumber(reserve_ms))
    end
  end
  return nil
end

-- wake_unhanded(waiters, prefix, reserve_ms, cluster): wake_one among the
-- waiters that no reader queued again after handing a reservation on
-- (those are scored from HANDED_ON up): a handed-on reservation never
-- comes back to a reader that handed it on, so the readers queued behind
-- a writer that died waiting hand it on once each, not back and forth
-- until the writer's registration expires.
local function wake_unhanded(waiters, prefix, reserve_ms, cluster)
  for i = 1, 16 do
    local w = redis.call('ZRANGEBYSCORE', waiters, '-inf', '(' .. string.format('%.0f', HANDED_ON), 'LIMIT', 0, 1)
    if #w == 0 then return nil end
    redis.call('ZREM', waiters, w[1])
    if redis.call('PUBLISH', prefix .. w[1], '1') > 0 or cluster == '1' then
      return w[1] .. '|' .. string.format('%.0f', now_ms() + tonumber(reserve_ms))
    end
  end
  return nil
end

-- take_marker(v, rel): an acquisition is about to overwrite v; if v is a
-- release marker ("|<token>...", token > 0), record its token in the
-- receipt list rel, which keeps (at least) the last RECEIPTS tokens and
-- expires RECEIPT_RETENTION_MS after the latest. The list is trimmed back
-- to RECEIPTS once it holds twice as many, saving an LTRIM on most
-- hand-overs.
local function take_marker(v, rel)
  local tok = v and string.match(v, '^|(%d+)')
  if not tok or tok == '0' then return end
  if redis.call('LPUSH', rel, tok) > 2 * RECEIPTS then
    redis.call('LTRIM', rel, 0, RECEIPTS - 1)
  end
  redis.call('PEXPIRE', rel, RECEIPT_RETENTION_MS)
end

-- has_receipt(v, rel, tok): whether the release of the lease with token
-- tok is known to have happened: v is its marker, or tok is among the
-- last RECEIPTS tokens in rel.
local function has_receipt(v, rel, tok)
  if tok == '' then return false end
  if v and string.match(v, '^|(%d+)') == tok then return true end
  for _, t in ipairs(redis.call('LRANGE', rel, 0, RECEIPTS - 1)) do
    if t == tok then return true end
  end
  return false
end

-- Shared and Limited holders (a "group"). While a group holds key P:{T},
-- its value is "*<mode>|<token>|<limit>" (mode "s" or "l", token the
-- latest issued, limit 0 for shared), and each holder is an entry of the
-- sorted set P:{T}:h (owner scored by its expiry, ms on the server's
-- clock) and of the hash P:{T}:hd (owner -> "<token>|<metadata>"). The
-- three keys expire at the latest holder's expiry.

-- is_group(v): whether lock value v is a group's.
local function is_group(v)
  return v ~= nil and v ~= false and string.sub(v, 1, 1) == '*'
end

-- purge_holders(h, hd, now): remove the holders whose lease ended.
local function purge_holders(h, hd, now)
  local gone = redis.call('ZRANGEBYSCORE', h, '-inf', string.format('%.0f', now))
  for _, o in ipairs(gone) do
    redis.call('HDEL', hd, o)
  end
  if #gone > 0 then
    redis.call('ZREMRANGEBYSCORE', h, '-inf', string.format('%.0f', now))
  end
end

-- group_holders(h, hd, now): the live holders, flat: owner, "<token>|<metadata>",
-- ms left, for each, in grant order; and the most ms left.
local function group_holders(h, hd, now)
  purge_holders(h, hd, now)
  local out, most = {}, 0
  local zs = redis.call('ZRANGE', h, 0, -1, 'WITHSCORES')
  local ents = {}
  for i = 1, #zs, 2 do
    local d = redis.call('HGET', hd, zs[i]) or '0|'
    ents[#ents + 1] = {zs[i], d, tonumber(string.match(d, '^(%d+)')) or 0, tonumber(zs[i + 1]) - now}
  end
  table.sort(ents, function(a, b) return a[3] < b[3] end)
  for _, e in ipairs(ents) do
    out[#out + 1] = e[1]
    out[#out + 1] = e[2]
    out[#out + 1] = string.format('%.0f', e[4])
    if e[4] > most then most = e[4] end
  end
  return out, most
end

-- group_expire(lk, h, hd): make the group's keys expire with its latest
-- holder.
local function group_expire(lk, h, hd)
  local last = redis.call('ZRANGE', h, -1, -1, 'WITHSCORES')
  if #last == 2 then
    for _, k in ipairs({lk, h, hd}) do
      redis.call('PEXPIREAT', k, last[2])
    end
  end
end

-- live_writers(wr, now): the number of registered waiting writers whose
-- registration has not expired.
local function live_writers(wr, now)
  redis.call('ZREMRANGEBYSCORE', wr, '-inf', string.format('%.0f', now))
  return redis.call('ZCARD', wr)
end

-- register_writer(wr, id, ttl): register waiting writer id until ttl ms
-- from now (a later attempt moves it).
local function register_writer(wr, id, ttl)
  if id == '' then return end
  local until_ms = now_ms() + tonumber(ttl)
  redis.call('ZADD', wr, string.format('%.0f', until_ms), id)
  local last = redis.call('ZRANGE', wr, -1, -1, 'WITHSCORES')
  redis.call('PEXPIREAT', wr, last[2])
end

-- poke_first(waiters, prefix): tell the first queued waiter, without
-- dequeuing it or reserving anything for it, that the key may be free for
-- it (a grant to a waiting reader, a writer that gave up).
local function poke_first(waiters, prefix)
  local w = redis.call('ZRANGE', waiters, 0, 0)
  if #w == 1 then
    redis.call('PUBLISH', prefix .. w[1], '1')
  end
end

-- poke_from(waiters, prefix, after, cluster, pk): tell queued waiters, in
-- queue order from the one after waiter id after (from the first when
-- after is ''), without dequeuing them or reserving anything, that a
-- permit is free, until a PUBLISH reaches a listener (at most 16 tried;
-- on a Cluster, whose PUBLISH counts only this node's listeners, the
-- first one); the key pk then names the waiter told, for a few seconds. A
-- waiter that cannot use a permit (another mode or limit), told so,
-- passes the word on to the one after it (see pass_permit): it travels
-- forward through the queue, once per telling, to whoever can take it.
local function poke_from(waiters, prefix, after, cluster, pk)
  local start = 0
  if after ~= '' then
    local r = redis.call('ZRANK', waiters, after)
    if not r then return end
    start = r + 1
  end
  for _, w in ipairs(redis.call('ZRANGE', waiters, start, start + 15)) do
    if redis.call('PUBLISH', prefix .. w, '1') > 0 or cluster == '1' then
      redis.call('SET', pk, w, 'PX', 5000)
      return
    end
  end
  redis.call('DEL', pk)
end

-- pass_permit(v, n, waiters, prefix, wait_id, cluster, pk): a waiter's
-- attempt was refused by group value v with n live holders for a reason
-- other than a full semaphore (another mode, another limit); when v is a
-- semaphore with a free permit and this waiter is the one last told of a
-- free permit (pk, see poke_from), pass the word on to the waiters queued
-- after it. Attempts not told so (polls) pass nothing on.
local function pass_permit(v, n, waiters, prefix, wait_id, cluster, pk)
  if wait_id == '' or not prefix or prefix == '' or not pk then return end
  local mode, limit = string.match(v, '^%*(%a)|%d+|(%d+)')
  if mode == 'l' and n < tonumber(limit) and redis.call('GET', pk) == wait_id then
    poke_from(waiters, prefix, wait_id, cluster, pk)
  end
end
