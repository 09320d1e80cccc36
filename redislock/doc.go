// Package redislock implements dlock.Locker on a single Redis deployment
// (standalone, Sentinel or Cluster, through go-redis's UniversalClient).
//
// Protocol. Acquire is one Lua script: SET key value PX ttl when the key
// is free, where the value is "<owner>|<token>|<metadata json>". A release
// replaces the value with the marker "|<token>" (kept FenceRetention), so
// the next token is marker + 1; without a marker the token is the server
// time in µs. Refresh is compare-and-PEXPIRE and release is
// compare-and-replace; both compare the owner and so never touch another
// holder's lock, and both are safe to retry: an acquisition executed twice
// (go-redis resends a script whose reply was lost) is granted its own lease
// again, and a release executed twice succeeds again, so a lost reply is
// never mistaken for a held key or a lost lock. A release recognises its
// own earlier release by its token: in the marker it left, or, once the
// key changed hands, in the key's receipts, a list of the tokens of the
// last 8 markers taken over, which the acquisition that overwrites a
// marker appends to (in the same script) and which expires a minute after
// the latest hand-over. A retry is recognised however often the key
// changed hands meanwhile, up to 8 hand-overs and within a minute of the
// latest (while nobody takes the key over, the marker recognises it for
// FenceRetention); later than that it is reported as a lease no longer
// held (ErrLockLost). Recording at the hand-over keeps the uncontended
// acquire-and-release free of an extra key.
// The keys, values and scripts are dlock's Redis wire protocol, documented
// (and versioned) in package redisproto, which redlock shares.
//
// Waiting. A waiter listens on a pub/sub channel of its own and its failed
// attempts queue it in the key's waiter set. A release wakes the first
// queued waiter still listening, and reserves the key for it for 100ms, so
// waiters are served in queue order and one release causes one retry, not a
// herd. Waiters also poll, on a jittered backoff bounded by the time left
// on the lease, so a lost message costs at most one backoff step. A waiter
// that leaves (Acquire returned, with or without the lock) removes itself
// from the queue in the background (one pipeline of ZREMs per client for
// all waiters leaving meanwhile), once none of its attempts is in flight,
// so that the queue holds live waiters only; an entry whose removal failed
// is skipped by releases and expires with the queue (a minute after the
// last failed attempt). On a Cluster, a Locker's waiters share one pub/sub
// connection, on one node, and a release on another master reaches them
// over the cluster bus; as PUBLISH there counts only the receivers on its
// own node, whether the first queued waiter still listens is unknown, so
// the release wakes it and reserves the key for it regardless: a waiter
// that left without being dequeued costs the next one at most the 100ms
// reservation. While a key is reserved, anyone else's attempt fails with a
// *dlock.NotAcquiredError that names no holder: its
// Metadata[MetaReservedForWaiter] is the waiter's id and its TTL the
// reservation left.
//
// Renewal. With auto-refresh on (the default) every lock taken through one
// Locker is renewed by one watchdog at TTL/3, in one pipelined round trip
// for all locks due together (on a Cluster, one pipeline per master, the
// masters concurrently). Each lock's renewal counts as soon as its server
// answered, so a hung master costs only the locks it holds: they are lost
// at their local deadline, while the locks on the other masters stay
// renewed. The watchdog runs on a timer: no goroutine exists between
// renewals.
//
// Deadlines. Every call returns by its context, whatever the go-redis
// client's timeouts: the dlock core abandons a call still running at the
// deadline, List does the same, and closing a waiter's subscription never
// waits on the network.
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
// use fencing tokens and a Guard for correctness. After a restart that lost
// the key, tokens restart from the server time in µs, above every earlier
// token unless the server's clock went back further than the time since the
// last acquisition. The release marker expires after FenceRetention (1h),
// so locking many distinct keys does not grow Redis without bound. The
// keys of one lock (lease, waiter set) share the "{key}" hash tag and so
// one Cluster slot; a key containing '}' still works (its tag is then the
// part before the first '}'), and a key starting with '}' is stored with a
// NUL byte in front of it ("dlock:{\x00}x}"), so that its tag is not
// empty. Guard resources are encoded the same way.
package redislock
