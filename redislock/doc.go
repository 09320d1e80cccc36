// Package redislock implements dlock.Locker on a single Redis deployment
// (standalone, Sentinel or Cluster, through go-redis's UniversalClient).
//
// Protocol. Acquire is one Lua script: SET key value NX PX ttl, where the
// value is "<owner>|<token>|<metadata json>", together with the fencing
// counter update. Refresh is compare-and-PEXPIRE and release is
// compare-and-DEL followed by a PUBLISH that wakes waiters; both compare the
// owner and so never touch another holder's lock, and both are safe to
// retry. Waiters subscribe to the key's release channel before their next
// attempt and otherwise sleep until the holder's lease would expire (the
// PTTL the failed attempt returned) or a jittered backoff step passes,
// whichever is first: a lost message costs one backoff step, never a
// stranded waiter.
//
// Renewal. With auto-refresh on (the default) every lock taken through one
// Locker is renewed by one watchdog at TTL/3, in one pipelined round trip
// for all locks due together. The watchdog runs on a timer: no goroutine
// exists between renewals.
//
// Guarantees, given a Redis that keeps its data (no failover to a replica
// that missed the write, no restart without persistence within a TTL):
// mutual exclusion; fencing tokens that strictly increase across holders of
// a key; Lost() closing before the server-side key can expire (the local
// deadline is the start of the last successful acquire or renewal request
// plus TTL minus the drift allowance, measured on the client's monotonic
// clock).
//
// Not guaranteed: exclusion across a failover or a restart that loses the
// key (asynchronous replication acknowledges SET before replicas have it);
// use fencing tokens and a Guard for correctness. Tokens are
// max(previous token + 1, server time in µs), so they keep increasing after
// a restart that lost the counter, unless the server's clock went back
// further than the time since the last acquisition. The counter key
// expires FenceRetention (1h) after the key's last acquisition, so locking
// many distinct keys does not grow Redis without bound. Keys of one lock share
// the "{key}" hash tag and so one Cluster slot; a key containing '}' still
// works (its tag is then the part before the first '}').
package redislock
