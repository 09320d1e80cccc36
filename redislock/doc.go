// Package redislock implements dlock.Locker on a single Redis deployment
// (standalone, Sentinel or Cluster, through go-redis's UniversalClient),
// and Guard, a guard.Guard whose fences and values live in Redis.
//
//	l := redislock.New(client, redislock.WithPrefix("myapp"), dlock.WithObserver(obs))
//	err := dlock.Do(ctx, l, "nightly-report", func(ctx context.Context, lk *dlock.Lock) error { ... })
//
// New takes redislock's own options (WithPrefix) and the core's
// (dlock.WithObserver) in one list. A nil client gives a Locker whose
// every call (Acquire, TryAcquire, List) fails with an error wrapping
// dlock.ErrNilClient. Locker runs on the dlock core (dlock.Engine) as a
// driver named "redis": the core owns the wait loop, the Lock handle, the
// watchdog and the Observer events; this package owns the protocol below.
// Locker implements dlock.Lister: List returns the held keys under a
// prefix, sorted, each with its holder and the size of its waiter queue.
// Locks are exclusive: dlock.WithShared and dlock.WithLimit are refused
// with an error wrapping dlock.ErrUnsupported.
//
// # Protocol
//
// Acquire is one Lua script: SET key value PX ttl when the key is free,
// where the value is "<owner>|<token>|<metadata json>". A release
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
// acquire-and-release free of an extra key. An attempt whose outcome is
// unknown (a lost reply, a context that ended mid-request) is undone in
// the background by the core (driver.Aborter), with a compare-and-release
// on its owner. The keys, values and scripts are dlock's Redis wire
// protocol, documented (and versioned) in package redisproto, which
// redlock shares.
//
// # Waiting
//
// A waiter listens on a pub/sub channel of its own and its failed
// attempts queue it in the key's waiter set (its wait id,
// driver.WaitIDer). A release wakes the first queued waiter still
// listening, and reserves the key for it for 100ms, so waiters are served
// in queue order and one release causes one retry, not a herd. Waiters
// also poll, on a jittered backoff bounded by the time left on the lease,
// so a lost message costs at most one backoff step. A waiter that leaves
// (Acquire returned, with or without the lock) removes itself from the
// queue in the background (one pipeline of ZREMs per client for all
// waiters leaving meanwhile), once none of its attempts is in flight, so
// that the queue holds live waiters only; an entry whose removal failed is
// skipped by releases and expires with the queue (a minute after the last
// failed attempt). On a Cluster, a Locker's waiters share one pub/sub
// connection, on one node, and a release on another master reaches them
// over the cluster bus; as PUBLISH there counts only the receivers on its
// own node, whether the first queued waiter still listens is unknown, so
// the release wakes it and reserves the key for it regardless: a waiter
// that left without being dequeued costs the next one at most the 100ms
// reservation. While a key is reserved, anyone else's attempt fails with a
// *dlock.NotAcquiredError whose one holder has no owner: its
// Metadata[MetaReservedForWaiter] is the waiter's id and its TTL the
// reservation left.
//
// # Renewal
//
// With auto-refresh on (the default) every lock taken through one Locker
// is renewed by the core's watchdog at TTL/3, in one pipelined round trip
// for all locks due together (driver.BatchRenewer; on a Cluster, one
// pipeline per master, the masters concurrently). Each lock's renewal
// counts as soon as its server answered, so a hung master costs only the
// locks it holds: they are lost at their local deadline, while the locks
// on the other masters stay renewed. The watchdog runs on a timer: no
// goroutine exists between renewals.
//
// # Deadlines
//
// Every call returns by its context, whatever the go-redis client's
// timeouts: the dlock core abandons a driver call still running at the
// deadline, List and every Guard method do the same (an error wrapping
// dlock.ErrUnavailable and the context's error), and closing a waiter's
// subscription never waits on the network.
//
// # Guard
//
// Guard applies the rule of package guard (dlock.Fence.Admit) in the Lua
// script that performs the operation, so the check, the record of the new
// highest fence and the operation are atomic on the server: Put, Get
// (a fenced read), IncrBy and Eval (a script of the caller's own under
// the fence check). Token 0 is refused by the script; shared fences are
// admitted at or above the highest token and never recorded. Refusals are
// *dlock.StaleTokenError values and are reported as dlock.EventRejected
// to the Observer given to NewGuard with dlock.WithObserver. The fence of
// resource R is "<prefix>:guard:{R}" and the value of name N is that key,
// a NUL byte and N, in the same Cluster slot (see Guard). Version 1 kept
// values at "<prefix>:data:{R}:<name>"; a Guard does not read them.
//
// # Guarantees
//
// Given a Redis that keeps its data (no failover to a replica that missed
// the write, no restart without persistence within a TTL):
//
//   - Mutual exclusion: at most one holder per key among Lockers with the
//     same prefix on the same deployment.
//   - Fencing tokens that strictly increase across holders of a key.
//   - Lost() closing before the server-side key can expire: the local
//     deadline is the start of the last successful acquire or renewal
//     request plus TTL minus the drift allowance, measured on the client's
//     monotonic clock.
//   - Owner-checked refresh and release, safe to retry after a lost reply
//     (within the receipt limits above).
//   - Every call returns by its context's deadline, also on a stalled link.
//   - A Guard never admits, for a resource, a fence older than an
//     exclusive fence it admitted, for as long as Redis keeps the fence key
//     (it has no expiry); the rule runs on the server, so a write abandoned
//     at its deadline and executed later is still fenced.
//
// # Not guaranteed
//
//   - Exclusion across a failover or a restart that loses the key
//     (asynchronous replication acknowledges SET before replicas have it);
//     use fencing tokens and a Guard for correctness. After a restart that
//     lost the key, tokens restart from the server time in µs, above every
//     earlier token unless the server's clock went back further than the
//     time since the last acquisition. A Guard whose fence key was lost
//     admits any fence again.
//   - Shared and counted locks (dlock.WithShared, dlock.WithLimit): refused
//     with dlock.ErrUnsupported.
//   - An exact waiter count in List: a waiter that left while its link
//     failed stays counted until its queue expires (a minute).
//   - Strict FIFO among waiters: a reservation lasts 100ms, and a waiter
//     that misses it (or a newcomer's attempt after it) competes again.
//   - That the release marker outlives FenceRetention (1h): locking many
//     distinct keys does not grow Redis without bound, and a key untouched
//     for longer gets its tokens from the server clock again.
//   - Keys: the keys of one lock (lease, waiter set) share the "{key}" hash
//     tag and so one Cluster slot; a key containing '}' still works (its
//     tag is then the part before the first '}'), and a key starting with
//     '}' is stored with a NUL byte in front of it ("dlock:{\x00}x}"), so
//     that its tag is not empty. Guard resources are encoded the same way.
//     Locks with a common hash tag share a slot and so a master.
//   - That a Guard's operation whose call failed or was abandoned did not
//     take effect; it stays fenced.
package redislock
