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
