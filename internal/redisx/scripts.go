package redisx

import (
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Lua helpers shared by the scripts below, each prepended to the scripts
// that call it (a script's chunk defines its helpers on every call, so a
// script carries only those it uses).
//
// now_ms(): the server's time in ms.
//
// reserved_left(v, wait_id): ms left on the reservation a release marker v
// ("|<token>|<wait id>|<until ms>") holds for a waiter other than wait_id;
// 0 when there is none.
//
// queue_waiter(waiters, id, score, pttl): queue waiter id (once) and keep
// the queue a minute longer than the current lease or reservation.
//
// wake_one(waiters, prefix, reserve_ms, cluster): pop queued waiters until
// a PUBLISH on prefix..id reaches a listener (PUBLISH counts receivers, so
// departed waiters are skipped) and return "<id>|<until ms>", the
// reservation for that waiter; nil when no queued waiter listens. On a
// Cluster (cluster == '1') PUBLISH reaches subscribers on every node over
// the cluster bus but counts only this node's, so a count of 0 proves
// nothing: the first queued waiter is popped, told and reserved for
// whatever the count (a departed one costs the next at most the
// reservation).
//
// take_marker(v, rel): an acquisition is about to overwrite v; if v is a
// release marker ("|<token>...", token > 0), record its token in the
// receipt list rel, which keeps (at least) the last Receipts tokens and
// expires ReceiptRetention after the latest. The list is trimmed back to
// Receipts once it holds twice as many, saving an LTRIM on most
// hand-overs.
//
// has_receipt(v, rel, tok): whether the release of the lease with token
// tok is known to have happened: v is its marker, or it is among the last
// Receipts tokens in rel.
const (
	luaNowMs = `
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
`
	luaReservedLeft = `
local function reserved_left(v, wait_id)
  local wid, exp = string.match(v, '^|%d+|([^|]*)|(%d+)$')
  if not wid or wid == wait_id then return 0 end
  return math.max(tonumber(exp) - now_ms(), 0)
end
`
	luaQueueWaiter = `
local function queue_waiter(waiters, id, score, pttl)
  if id == '' then return end
  redis.call('ZADD', waiters, 'NX', score, id)
  redis.call('PEXPIRE', waiters, math.max(pttl, 0) + 60000)
end
`
	luaWakeOne = `
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
`
)

var (
	luaTakeMarker = fmt.Sprintf(`
local function take_marker(v, rel)
  local tok = v and string.match(v, '^|(%%d+)')
  if not tok or tok == '0' then return end
  if redis.call('LPUSH', rel, tok) > %[1]d then
    redis.call('LTRIM', rel, 0, %[2]d)
  end
  redis.call('PEXPIRE', rel, %[3]d)
end
`, 2*Receipts, Receipts-1, Ms(ReceiptRetention))
	luaHasReceipt = fmt.Sprintf(`
local function has_receipt(v, rel, tok)
  if tok == '' then return false end
  if v and string.match(v, '^|(%%d+)') == tok then return true end
  for _, t in ipairs(redis.call('LRANGE', rel, 0, %[1]d)) do
    if t == tok then return true end
  end
  return false
end
`, Receipts-1)
)

// acquireScript is the single-deployment acquisition. KEYS[1]=lock,
// KEYS[2]=waiters, KEYS[3]=receipts; ARGV[1]=owner, ARGV[2]=ttl ms,
// ARGV[3]=metadata json, ARGV[4]=wait id ("" when not waiting), ARGV[5]=its
// queue score. Returns {1, token} or {0, holder value, pttl}.
//
// The lock key holds "<owner>|<token>|<metadata>" while held and, after a
// release, the marker "|<token>" for a retention period: the last token
// issued for the key lives in the key itself. The token is marker + 1, or,
// when there is no marker (first use, expiry without release, a restart
// that lost it), the server time in µs: tokens increase on every
// acquisition, and after a restart still start above every earlier token
// unless the server clock went back. Tokens are formatted with %.0f: Lua
// numbers are doubles, exact for integers below 2^53 (µs timestamps stay
// below that until the year 2255).
//
// A lease already held by ARGV[1] is granted again, unchanged (same token,
// same expiry): owners are fresh per attempt, so that is this very attempt,
// executed twice because the client retried a request whose reply was
// lost.
//
// A waiter whose attempt fails is added to the key's waiter queue, so the
// release can wake exactly one waiter (see releaseScript). While a release
// marker reserves the key for the waiter it woke ("|<token>|<wait id>|<until
// ms>"), everyone else is refused until the reservation ends.
//
// An acquisition that overwrites a release marker records the marker's
// token in the key's receipts (see releaseScript).
var acquireScript = redis.NewScript(luaNowMs + luaReservedLeft + luaQueueWaiter + luaTakeMarker + `
local v = redis.call('GET', KEYS[1])
local last = 0
if v then
  if string.sub(v, 1, #ARGV[1] + 1) == ARGV[1] .. '|' then
    if ARGV[4] ~= '' then
      redis.call('ZREM', KEYS[2], ARGV[4])
    end
    return {1, string.match(v, '^[^|]*|(%d+)') or '0'}
  end
  local pttl = 0
  if string.find(v, '|', 1, true) ~= 1 then
    pttl = redis.call('PTTL', KEYS[1]) -- held
  else
    pttl = reserved_left(v, ARGV[4]) -- a release marker
    last = tonumber(string.match(v, '^|(%d+)')) or 0
  end
  if pttl ~= 0 then
    queue_waiter(KEYS[2], ARGV[4], ARGV[5], pttl)
    return {0, v, pttl}
  end
end
local tok = last + 1
if last == 0 then
  local t = redis.call('TIME')
  local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
  if tok < floor then tok = floor end
end
tok = string.format('%.0f', tok)
take_marker(v, KEYS[3])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. tok .. '|' .. ARGV[3], 'PX', ARGV[2])
if ARGV[4] ~= '' then
  redis.call('ZREM', KEYS[2], ARGV[4])
end
return {1, tok}
`)

// refreshScript (compare-and-pexpire): KEYS[1]=lock; ARGV[1]="owner|",
// ARGV[2]=ttl ms. Returns 1 if extended, 0 if not held by owner.
var refreshScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
`)

// releaseScript (compare-and-release + wake one): KEYS[1]=lock,
// KEYS[2]=waiters, KEYS[3]=receipts; ARGV[1]="owner|", ARGV[2]=marker
// retention ms, ARGV[3]=waiter channel prefix, ARGV[4]=reservation ms,
// ARGV[5]=the lease's token ("" when unknown), ARGV[6]="1" on a Cluster.
// If owner holds the lock it publishes on the channel of the first queued
// waiter that is still listening (PUBLISH counts receivers; departed
// waiters are skipped; on a Cluster, the first queued waiter) and
// replaces the value with the marker "|<token>", extended with that
// waiter's id and a short reservation: the woken waiter gets the key even
// if the releaser (or anyone else) asks again first, so waiters are served
// in queue order and none is starved by barging. Returns 1, or 0 if not
// held by owner.
//
// A release that already took effect returns 1 again (a client retrying a
// request whose reply was lost, or a second Release after an error). Its
// receipt says so: the marker "|<token>" it left, and, once an acquisition
// overwrote the marker, the token recorded in the receipt list (the last
// Receipts markers taken over, kept ReceiptRetention after the latest).
// Tokens of a key strictly increase, so a token names one lease; a marker
// is written only by the release of that lease. The next acquisition's
// token (ARGV[5] + 1: only our marker yields it, a key without marker
// gets the server's clock in µs, far past it by then) says so too, for
// markers taken over by a version that kept no receipts.
var releaseScript = redis.NewScript(luaNowMs + luaWakeOne + luaHasReceipt + `
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
`)

// quorumReleaseScript: Redlock's release on one node. KEYS[1]=lock,
// KEYS[2]=waiters, KEYS[3]=receipts; ARGV[1]="owner|", ARGV[2]=waiter
// channel prefix, ARGV[3]=reservation ms, ARGV[4]=the lease's quorum token
// ("" when unknown: an attempt that failed before its commit), ARGV[5]=
// marker retention ms, ARGV[6]="1" on a Cluster. Like releaseScript, it
// wakes the first queued waiter still listening and reserves the key for it
// ("|<token>|<id>|<until>"); the quorum counter lives in its own key.
// Waiters register on every node with the same score, so every node wakes
// and reserves for the same waiter, which then wins a majority instead of
// splitting the votes with the others. With a token, the key keeps the
// marker "|<token>" (free for everyone, as the grant script reads it) for
// the retention, so that a retried release recognises its own work and
// returns 1 again: by the marker, or, once a grant took the marker over, by
// the token recorded in the receipts. Without a token the key is deleted.
// Returns 1, or 0 if not held by owner.
var quorumReleaseScript = redis.NewScript(luaNowMs + luaWakeOne + luaHasReceipt + `
local v = redis.call('GET', KEYS[1])
if not (v and string.sub(v, 1, #ARGV[1]) == ARGV[1]) then
  if has_receipt(v, KEYS[3], ARGV[4]) then
    return 1 -- released already
  end
  return 0
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
return 1
`)

// grantScript is phase one of a quorum acquisition. KEYS[1]=lock,
// KEYS[2]=fence, KEYS[3]=waiters, KEYS[4]=receipts; ARGV[1]=owner,
// ARGV[2]=ttl ms, ARGV[3]=metadata json, ARGV[4]=wait id or "", ARGV[5]=its
// queue score (the same on every node, so every node wakes the same waiter
// first).
// Returns {1, floor} where floor = max(counter, server time in µs), or
// {0, holder value, pttl}. A lease already held by the same owner (the
// same attempt executed twice: the client retried a request whose reply
// was lost) is granted again and left as it is (a commit may have recorded
// the token in it already; its expiry stays the one the attempt counted
// from). A release marker ("|<token>", with or without a reservation that
// has ended) counts as free; its token goes to the receipts when the grant
// overwrites it.
var grantScript = redis.NewScript(luaNowMs + luaReservedLeft + luaQueueWaiter + luaTakeMarker + `
local cur = redis.call('GET', KEYS[1])
local pttl = 0
local mine = cur and string.sub(cur, 1, #ARGV[1] + 1) == ARGV[1] .. '|'
if cur and string.sub(cur, 1, 1) == '|' then
  pttl = reserved_left(cur, ARGV[4]) -- a release marker: free unless reserved
elseif cur and not mine then
  pttl = redis.call('PTTL', KEYS[1]) -- held by someone else
end
if pttl ~= 0 then
  queue_waiter(KEYS[3], ARGV[4], ARGV[5], pttl)
  return {0, cur, pttl}
end
if not mine then
  take_marker(cur, KEYS[4])
  redis.call('SET', KEYS[1], ARGV[1] .. '|0|' .. ARGV[3], 'PX', ARGV[2])
end
if ARGV[4] ~= '' then
  redis.call('ZREM', KEYS[3], ARGV[4])
end
local t = redis.call('TIME')
local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
local c = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
if c < floor then c = floor end
return {1, string.format('%.0f', c)}
`)

// commitScript is phase two: KEYS[1]=lock, KEYS[2]=fence; ARGV[1]="owner|",
// ARGV[2]=token, ARGV[3]=full value, ARGV[4]=counter retention ms. If the
// owner still holds the lease it records the value (keeping the TTL) and
// raises the counter to at least the token. Returns 1, or 0 if not held.
var commitScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if not (v and string.sub(v, 1, #ARGV[1]) == ARGV[1]) then
  return 0
end
redis.call('SET', KEYS[1], ARGV[3], 'KEEPTTL')
local c = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
local t = tonumber(ARGV[2])
if c < t then c = t end
redis.call('SET', KEYS[2], string.format('%.0f', c), 'PX', ARGV[4])
return 1
`)
