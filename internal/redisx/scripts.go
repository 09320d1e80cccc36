package redisx

import "github.com/redis/go-redis/v9"

// acquireScript: KEYS[1]=lock, KEYS[2]=fence; ARGV[1]=owner, ARGV[2]=ttl ms,
// ARGV[3]=metadata json, ARGV[4]=fence retention ms. Returns {1, token} or
// {0, holder value, pttl}.
//
// The token is max(last token + 1, server time in µs): it increases on
// every acquisition, and after a restart that lost the fence key it still
// starts above every token issued before (unless the server clock went
// back). Tokens are formatted with %.0f: Lua numbers are doubles, exact for
// integers below 2^53 (µs timestamps stay below that until year 2255).
//
// The fence key expires a retention period after the last acquisition, so a
// service that locks millions of distinct keys does not keep a counter for
// each forever. That is safe because the clock floor alone already exceeds
// every earlier token once the clock has moved past them: the counter only
// matters for acquisitions within the same microsecond, or for a clock that
// stepped back, both far shorter than the retention.
var acquireScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur then
  return {0, cur, redis.call('PTTL', KEYS[1])}
end
local t = redis.call('TIME')
local floor = tonumber(t[1]) * 1000000 + tonumber(t[2])
local last = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
local tok = last + 1
if tok < floor then tok = floor end
tok = string.format('%.0f', tok)
redis.call('SET', KEYS[2], tok, 'PX', ARGV[4])
redis.call('SET', KEYS[1], ARGV[1] .. '|' .. tok .. '|' .. ARGV[3], 'PX', ARGV[2])
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

// releaseScript (compare-and-delete + wake): KEYS[1]=lock; ARGV[1]="owner|",
// ARGV[2]=release channel. Returns 1 if deleted, 0 if not held by owner.
var releaseScript = redis.NewScript(`
local v = redis.call('GET', KEYS[1])
if v and string.sub(v, 1, #ARGV[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], '1')
  return 1
end
return 0
`)

// grantScript is phase one of a quorum acquisition. KEYS[1]=lock,
// KEYS[2]=fence; ARGV[1]=owner, ARGV[2]=ttl ms, ARGV[3]=metadata json.
// Returns {1, floor} where floor = max(counter, server time in µs), or
// {0, holder value, pttl}. A lease already held by the same owner (a
// retried attempt) is granted again.
var grantScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur and string.sub(cur, 1, #ARGV[1] + 1) ~= ARGV[1] .. '|' then
  return {0, cur, redis.call('PTTL', KEYS[1])}
end
redis.call('SET', KEYS[1], ARGV[1] .. '|0|' .. ARGV[3], 'PX', ARGV[2])
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
