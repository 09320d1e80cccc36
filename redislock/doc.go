// Package redislock implements dlock.Locker on a single Redis deployment
// (standalone, Sentinel or Cluster, through go-redis's UniversalClient),
// and Guard, a guard.Guard whose fences and values live in Redis.
//
//	l := redislock.New(client, redislock.WithPrefix("myapp"), dlock.WithObserver(obs))
//	err := dlock.Do(ctx, l, "nightly-report", func(ctx context.Context, lk *dlock.Lock) error { ... })
//
// New takes redislock's own options (WithPrefix, WithReplicaAcks) and the core's
// (dlock.WithObserver) in one list. A nil client gives a Locker whose
// every call (Acquire, TryAcquire, List) fails with an error wrapping
// dlock.ErrNilClient. Locker runs on the dlock core (dlock.Engine) as a
// driver named "redis": the core owns the wait loop, the Lock handle, the
// watchdog and the Observer events; this package owns the protocol below.
// Locker implements dlock.Lister: List returns the held keys under a
// prefix, sorted, each with its mode, its holders (one for an exclusive
// lock, every reader or permit holder otherwise), a semaphore's limit and
// the size of its waiter queue. Locks are exclusive by default; read-write
// locks (dlock.WithShared, with writer preference) and semaphores
// (dlock.WithLimit) are described under Shared and limited locks.
//
// # Protocol
//
// Acquire is one Lua script: SET key value PX ttl when the key is free,
// where the value is "<owner>|<token>|<metadata json>". A release
// replaces the value with the marker "|<token>" (kept FenceRetention), and
// every grant's token is max(marker + 1, server time in µs) (marker 0 when
// the key holds none): above the last one, and, after a restart or a
// failover that lost the marker, above every earlier one while the
// server clock is sane (see Not guaranteed). Refresh is compare-and-PEXPIRE and release is
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
// # Shared and limited locks
//
// Shared (dlock.WithShared) and limited (dlock.WithLimit(n)) holders of a
// key form a group, with scripts of their own (acquire_group, refresh_group,
// release_group), so the exclusive path keeps its protocol. The lock key
// then holds "*<mode>|<latest token>|<limit>", and each holder is an entry
// of two keys in the same slot: a sorted set of owners scored by the end
// of their lease on the server's clock (Redis TIME) and a hash of their
// tokens and metadata. Every holder is its own lease: its own owner, token,
// expiry, renewal (in the same batched pipeline as exclusive leases) and
// Lost(); a holder that crashed stops counting at its own expiry, whatever
// the others do, and the three keys expire with the latest holder. Each
// grant, whatever its mode, takes the next token of the key's single
// counter (the group's latest token or the release marker's, + 1, never
// below the server's time in µs), so a writer's token is
// above every reader's and permit's before it. A
// request of another mode than the holders' is refused with a
// *dlock.NotAcquiredError naming every holder; a limited request whose
// limit is not the holders' fails with an error wrapping
// dlock.ErrLimitMismatch naming both. The last holder's release leaves the
// release marker, wakes the first queued waiter and reserves the key for
// it, as an exclusive release does; a permit's release that leaves others
// pokes the first queued waiter still listening (without reservation or
// dequeuing it), and a poked waiter that cannot take a permit (a writer,
// a reader, another limit) passes the word on to the waiters queued after
// it, so a permit waiter queued behind them is told too; a
// reader's release that leaves others wakes nobody (a writer needs the
// last one gone). A waiting reader (or permit holder, while permits are
// left) that is granted pokes the next queued waiter, so readers queued
// behind a writer enter together once it is done. Release and Refresh are
// owner-checked; a release retried after a lost reply finds the holder's
// token in the key's receipts (see Protocol) and succeeds again; an
// acquisition retried finds its own holder and is granted it again.
//
// Writer preference: an exclusive attempt of a blocking Acquire that is
// refused registers its Acquire (driver.Request.Waiter) as a waiting writer
// in a sorted set of the key, scored by the end of the registration (one
// TTL after the attempt; the core attempts at least every TTL/3 while it
// waits). While a registration is live, new shared requests are refused
// (a *dlock.NotAcquiredError naming the readers, with a cause saying a
// writer waits), so readers that keep overlapping cannot starve it. The
// registration ends when the writer is granted the key, when its Acquire
// gives up (the core calls Leave, driver.Leaver, which also pokes the
// first queued waiter) or at its expiry: a writer that died keeps readers
// out for at most one TTL. TryAcquire registers nothing. A reader woken by
// a release while a writer waits passes the reservation on to the next
// queued waiter.
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
// # Eviction
//
// A server with maxmemory set and a maxmemory-policy other than
// noeviction may evict keys under memory pressure: allkeys-* policies any
// key, volatile-* policies any key with a TTL, which every lease has. An
// evicted lease frees the key for the next caller at once while its
// holder runs on until its next renewal finds the key gone; an evicted
// Guard fence key admits fences it had refused. So a Locker and a Guard
// ask the server on first use (CONFIG GET maxmemory*, or INFO memory where
// an ACL denies CONFIG; on a Cluster, every master), once per Locker or
// Guard, and refuse such a server: Acquire, TryAcquire and every Guard
// operation fail with an *EvictionError (wrapping dlock.ErrUnsupported)
// naming the policy and the limit. Set maxmemory-policy noeviction (Redis
// then refuses writes when full, which fails acquisitions instead of
// freeing held keys), or keep locks on a Redis without maxmemory; or pass
// WithUnsafeEviction to accept the risk. A server that answers neither
// command is accepted. The answer is kept for the Locker's life: a policy
// changed later (or a failover to a differently configured replica) is
// not noticed.
//
// # Breaks
//
// dlock.Break (one script) publishes a notice on the key's break channel
// ("<prefix>:{key}:b") when it removed a lease. A lock held for 100 ms
// listens on its key's channel, on a pub/sub connection of the Locker's
// (apart from the waiters', open while the Locker has a listening lock),
// and on a notice reads its key once: when the key no longer names its
// owner, its Lost() closes at once (dlock.LossBackend, wrapping
// dlock.ErrNotHeld), one notice and one read after the break instead of
// at the next renewal. The key is also read once when the SUBSCRIBE is
// confirmed, which covers a break before it: a break reaches its holder
// within about 100 ms and a round trip. A pub/sub connection lost (a
// notice may have been missed) makes every listener check. A listening
// lock costs a goroutine, a SUBSCRIBE and a read, and an UNSUBSCRIBE at
// its end, all in the background: the acquisition and the release do not
// wait for them, and a lock released within 100 ms costs none of them.
//
// # Replica acknowledgement
//
// With WithReplicaAcks(n, timeout) every acquire and renewal script is
// followed by WAIT n timeout in the same pipeline, so on the connection
// that ran it (WAIT counts the replicas that have that connection's
// writes; go-redis pools connections, so a separate WAIT could ask about
// another one): one round trip, the script then the WAIT. A grant fewer
// than n replicas acknowledged is rolled back at once (an owner-checked
// release, in the attempt, on its context) and the attempt fails with a
// *ReplicationError wrapping ErrNotReplicated and, when the rollback
// succeeded, dlock.ErrTransient: TryAcquire returns it, a blocking
// Acquire tries again after a backoff step while it may wait. A rollback
// that failed leaves the grant to the core's background undo
// (driver.Aborter), as any attempt of unknown outcome. A refused attempt
// needs no acknowledgement, but its WAIT, in the same pipeline, still
// runs: behind a replica that lags (WAIT counts the replicas that have
// everything up to the connection's latest command) a refusal, and a
// Guard write refused for a stale fence, take up to timeout, and under a
// context deadline shorter than timeout they end as dlock.ErrUnavailable
// instead of naming the holder or the newer fence. A renewal (one WAIT at the end of each
// server's renewal pipeline covers all its renewals) acknowledged by
// fewer is reported as a *ReplicationError, not as dlock.ErrNotHeld: the
// lease is still held on the primary, but its extension does not count,
// so the lock keeps its previous local deadline and Lost() fires at it
// unless a later renewal is acknowledged. Releases do not wait: a release
// a failover loses only leaves the lease to expire, delaying the next
// holder by at most the TTL, never admitting two. A Guard's writes (Put,
// IncrBy, Eval) wait too: fewer acknowledgements is a *ReplicationError
// saying the write was applied on the primary (and stays there, with the
// fence it recorded) but its fate across a failover is unknown; its
// reads (Get, Highest) do not wait. With acknowledgement off (n 0, the
// default) the scripts run exactly as without it: no pipeline, no WAIT.
//
// # Deadlines
//
// Every call returns by its context, whatever the go-redis client's
// timeouts: the dlock core abandons a driver call still running at the
// deadline, List and every Guard method do the same (an error wrapping
// dlock.ErrUnavailable and the context's error), and closing a waiter's
// subscription never waits on the network. An attempt, renewal or release
// whose connection was refused or reset fails as soon as go-redis gives up
// on it, with an error wrapping dlock.ErrUnavailable and go-redis's own.
//
// # Guard
//
// Guard applies the rule of package guard (dlock.FenceRecord.Admit) in the Lua
// script that performs the operation, so the check, the record of the new
// highest fence and the operation are atomic on the server: Put, Get
// (a fenced read), IncrBy and Eval (a script of the caller's own under
// the fence check). Token 0 is refused by the script; shared fences are
// admitted at or above the last exclusive fence's token and raise the
// highest token admitted, which exclusive fences must exceed. Refusals are
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
//   - Mutual exclusion: at most one exclusive holder per key among Lockers
//     with the same prefix on the same deployment, or any number of shared
//     holders and no exclusive one, or at most N holders of a key locked
//     with dlock.WithLimit(N); modes never mix, and a limit other than the
//     holders' is an error (dlock.ErrLimitMismatch).
//   - Fencing tokens that strictly increase across grants of a key, in
//     every mode (one counter per key).
//   - Each shared or limited holder's lease is its own: a crashed holder's
//     share or permit frees at its own expiry (on the server's clock),
//     never later, and never ends another holder's lease.
//   - Writer preference: once a blocking exclusive Acquire has been
//     refused, no new shared holder is admitted until it is granted, gives
//     up, or its registration expires (at most one TTL after its last
//     attempt).
//   - Lost() closing before the server-side key can expire: the local
//     deadline is the start of the last successful acquire or renewal
//     request plus TTL minus the drift allowance, measured on the client's
//     monotonic clock.
//   - Owner-checked refresh and release, safe to retry after a lost reply
//     (within the receipt limits above).
//   - Every call returns by its context's deadline, also on a stalled link.
//   - With WithReplicaAcks(n, ...): when Acquire returns a lock, and for
//     every renewal that extended its local deadline, at least n replicas
//     had acknowledged the lease (WAIT); an unacknowledged grant leaves no
//     lease (rolled back, or undone in the background).
//   - A Guard never admits, for a resource, a fence older than an
//     exclusive fence it admitted, for as long as Redis keeps the fence key
//     (it has no expiry); the rule runs on the server, so a write abandoned
//     at its deadline and executed later is still fenced.
//   - No lock is handed out, and no Guard operation runs, on a server that
//     reported at first use that it may evict keys (see Eviction), unless
//     WithUnsafeEviction was given.
//   - A holder whose lease dlock.Break removed is told promptly: its
//     Lost() closes after the break notice and one read, or the read at
//     its subscription 100 ms into the hold (see Breaks), while its server
//     is reachable and its subscription confirmed.
//
// # Not guaranteed
//
//   - Exclusion across a failover or a restart that loses the key
//     (asynchronous replication acknowledges SET before replicas have it);
//     use fencing tokens and a Guard for correctness. WithReplicaAcks
//     narrows this: a failover to an acknowledging replica keeps the
//     lease. It does not close it: replication stays asynchronous, WAIT
//     does not make a write durable (a replica that acknowledged may
//     still be the one not promoted, or lose the write in a restart
//     without persistence; Sentinel may promote a replica that did not
//     acknowledge), and a release, a Guard read and a lease's expiry are
//     not acknowledged. WAITAOF (Redis 7.2+, acknowledgement by the
//     append-only file) is not used.
//   - Exclusion while a holder still reaches a deposed primary. A primary
//     cut off from the Sentinels but not from the holder (a partition)
//     stays a primary after they promote a replica, and the holder's
//     renewals there succeed, while the new primary lets the lease expire
//     and grants the key again: a go-redis failover client leaves the old
//     primary only when the Sentinel it listens to announces the switch,
//     or for a connection it opens anew (it asks the Sentinels for the
//     master first; go-redis keeps pipelines, the watchdog's renewals
//     among them, on a pool of their own).
//     Without WithReplicaAcks the holder is not told for as long as the
//     partition lasts; with it, the deposed primary's renewals stop being
//     acknowledged once its replicas follow the new primary, so Lost()
//     closes within a TTL, but possibly after the new grant (a replica not
//     yet moved acknowledged the last renewal). Tokens still order the
//     holders. Redis's min-replicas-to-write (not tested here) bounds it
//     on the server side. A primary stopped across a failover (a long
//     pause, a frozen VM) and then continued is such a deposed primary
//     until the Sentinels demote it, seconds later: a renewal in flight
//     when it stopped, or sent before the client hears of the switch,
//     succeeds there, and without WithReplicaAcks the holder may believe
//     it holds the key for a while after the new primary granted it
//     again; its Lost() closes once its renewals fail.
//   - Prompt service through a hung Sentinel. A go-redis failover client
//     that needs a new connection asks the Sentinels for the master, and
//     waits for a hung one (SIGSTOP, a stalled link) up to its own
//     ReadTimeout (3s by default; a new client's first call took about
//     5s here) before it dials: calls still return by their context
//     (dlock.ErrUnavailable), but a context shorter than that fails where
//     a longer one would succeed. With every Sentinel
//     hung, a client keeps working on the connections it has and cannot
//     open new ones. An unknown master name is go-redis's error
//     ("redis: nil" after the Sentinels' replies), passed through as is.
//     (The dlock CLI pings the Sentinels of a URL first and gives go-redis
//     only those that answer.)
//   - Replica acknowledgement on a Cluster or a Ring: WithReplicaAcks
//     needs a standalone or Sentinel client (a *redis.Client); on any
//     other client every call fails with an error wrapping
//     dlock.ErrInvalidOption.
//   - Tokens that increase through a failover or a restart that lost the
//     key's latest writes. Every grant's token is at least the server's
//     time in µs, so the new primary still issues tokens above every
//     earlier one; tokens can repeat (or go back) through a failover only
//     if the new primary's clock is behind the old primary's by more than
//     the time between the last grant the new primary missed and its first
//     grant (for a restart: the server's clock went back further than the
//     time since the last acquisition), or if a token was issued above the
//     clock (a key whose marker was ahead of it). A Guard whose fence key
//     was lost admits any fence again.
//   - Writer preference against readers already holding: they keep their
//     leases, and the writer waits for the last of them. Limited requests
//     are not held back by waiting writers (writers and permits do not
//     mix anyway).
//   - That a waiting writer is preferred before its first attempt was
//     refused (a shared request that reaches the server first is
//     admitted), or while its link to the server is cut (its registration
//     then expires).
//   - Shared and limited leases across a jump of the server's wall clock:
//     their ends are times on it (as Redis's own key expiries are), so a
//     clock set forward ends them early.
//   - Fair ordering among readers and permit holders: a freed permit goes
//     to whoever asks first after the woken waiter was told, and waiters
//     also poll.
//   - An exact waiter count in List: a waiter that left while its link
//     failed stays counted until its queue expires (a minute).
//   - Strict FIFO among waiters: a reservation lasts 100ms, and a waiter
//     that misses it (or a newcomer's attempt after it) competes again.
//   - That the release marker outlives FenceRetention (1h): locking many
//     distinct keys does not grow Redis without bound, and a key untouched
//     for longer gets its tokens from the server clock again.
//   - Keys: the keys of one lock (lease, waiter set, holders, waiting
//     writers) share the "{key}" hash
//     tag and so one Cluster slot; a key containing '}' still works (its
//     tag is then the part before the first '}'), and a key starting with
//     '}' is stored with a NUL byte in front of it ("dlock:{\x00}x}"), so
//     that its tag is not empty. Guard resources are encoded the same way.
//     Locks with a common hash tag share a slot and so a master.
//   - That a Guard's operation whose call failed or was abandoned did not
//     take effect; it stays fenced.
//   - Exclusion on a server that may evict keys, with WithUnsafeEviction:
//     an evicted lease is granted again at once, and its holder finds out
//     at its next renewal (a third of the TTL later, at most); an evicted
//     Guard fence key admits older fences. The eviction check itself is
//     made once per Locker or Guard: a maxmemory-policy set afterwards, or
//     a failover to a server configured differently, is not noticed.
//   - Prompt notice of a lease deleted or evicted behind its holder's back
//     other than by dlock.Break (DEL, FLUSHALL, an expiry on the server's
//     clock): no keyspace notification is used (they are off by default
//     and configured server-wide), so the holder finds out at its next
//     renewal. A break notice published while the holder's pub/sub link
//     was down, or before its SUBSCRIBE took effect when Redis did not
//     confirm it within 2s, is missed likewise.
//   - Break notices on Redlock (package redlock): its holders learn of a
//     break at their next renewal.
package redislock
