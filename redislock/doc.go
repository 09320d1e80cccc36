// Package redislock implements dlock.Locker on a single Redis deployment
// (standalone, Sentinel or Cluster, through go-redis's UniversalClient),
// and Guard, a guard.Guard whose fences and values live in Redis.
//
//	l := redislock.New(client, redislock.WithPrefix("myapp"), dlock.WithObserver(obs))
//	err := dlock.Do(ctx, l, "nightly-report", func(ctx context.Context, lk *dlock.Lock) error { ... })
//
// New takes redislock's options (WithPrefix, WithReplicaAcks,
// WithUnsafeEviction, WithProtocol) and the core's (dlock.WithObserver)
// in one list; a
// nil client gives a Locker whose every call fails with an error wrapping
// dlock.ErrNilClient. The Locker runs on the dlock core as the driver
// "redis": one Lua script per acquisition, owner-checked renewal and
// release, a release marker carrying the key's last fencing token, all
// locks of a Locker renewed in one pipelined round trip per server. Locks
// are exclusive by default; dlock.WithShared gives read-write locks with
// writer preference and dlock.WithLimit semaphores. Waiters are woken one
// at a time over pub/sub, in queue order. List (dlock.Lister) reports the
// held keys under a prefix. The keys, values and scripts are dlock's Redis
// wire protocol, documented in package redisproto.
//
// Where the server refuses the client's user every script (an ACL with
// -@scripting) and offers Tair's CAS and CAD, the default Locker learns
// it from the first refusal and from then on speaks a Lua-free protocol of
// native commands, for exclusive locks (WithProtocol forces either
// protocol; Locker.Protocol says which is used).
//
// The protocol, waiting, renewal, eviction, breaks, replica
// acknowledgement, the Guard's key layout and the full guarantees and
// limits are described in docs/redislock.md.
//
// # Guarantees
//
// Given a Redis that keeps its data (no failover to a replica that missed
// the write, no restart without persistence within a TTL):
//
//   - Mutual exclusion among Lockers with the same prefix on one
//     deployment: one exclusive holder, or any number of shared holders,
//     or at most N with dlock.WithLimit(N); modes never mix, and another
//     limit is dlock.ErrLimitMismatch.
//   - Fencing tokens strictly increase across grants of a key, in every mode.
//   - Each shared or limited holder's lease is its own: it frees at its own
//     expiry (server clock) and never ends another holder's lease.
//   - Writer preference: once a blocking exclusive Acquire was refused, no
//     new shared holder until it is granted, gives up, or its registration
//     expires (at most one TTL after its last attempt).
//   - Lost() closes before the server-side key can expire (local deadline:
//     start of the last successful acquire or renewal + TTL - drift, on the
//     monotonic clock).
//   - Owner-checked refresh and release, safe to retry after a lost reply
//     (up to 8 hand-overs and within a minute of the latest).
//   - Every call returns by its context's deadline, also on a stalled link.
//   - With WithReplicaAcks(n, ...): a returned lock and every counted
//     renewal were acknowledged by at least n replicas; an unacknowledged
//     grant leaves no lease.
//   - A Guard never admits a fence older than an exclusive fence it admitted
//     while Redis keeps the fence key; the rule runs on the server, so an
//     abandoned write executed later is still fenced.
//   - No lock and no Guard operation on a server that reported at first use
//     that it may evict keys, unless WithUnsafeEviction.
//   - A holder whose lease dlock.Break removed is told promptly (a notice
//     and one read, or the read when its Locker's break subscription is
//     confirmed), while its server is reachable and that subscription
//     confirmed.
//
// # Not guaranteed
//
//   - Exclusion across a failover or restart that loses the key;
//     WithReplicaAcks narrows this but does not close it (WAIT is not
//     durability; releases, Guard reads and expiries are not acknowledged;
//     WAITAOF is not used). Use fencing tokens and a Guard.
//   - Exclusion while a holder still reaches a deposed primary (a partition,
//     or a paused primary resumed): without WithReplicaAcks the holder is
//     not told while it lasts; with it, Lost() closes within a TTL, possibly
//     after the new grant.
//   - Prompt service through a hung Sentinel: a new connection waits up to
//     the client's ReadTimeout; with every Sentinel hung, no new connection.
//   - Replica acknowledgement on a Cluster or a Ring (dlock.ErrInvalidOption).
//   - Increasing tokens through a failover or restart that lost the latest
//     writes, if the new server's clock is behind by more than the
//     interruption; a Guard whose fence key was lost admits any fence.
//   - Writer preference against readers already holding, for limited
//     requests, before the writer's first refusal, or while its link is cut.
//   - Shared and limited leases across a jump of the server's wall clock.
//   - Fair ordering among readers and permits; strict FIFO among waiters
//     (a reservation lasts 100ms); an exact waiter count in List.
//   - A release marker outliving FenceRetention (1h).
//   - Spreading over Cluster masters: locks sharing a hash tag share a slot.
//   - That a failed or abandoned Guard operation did not take effect (it
//     stays fenced).
//   - Exclusion on an evicting server with WithUnsafeEviction; the eviction
//     check is made once per Locker or Guard.
//   - Prompt notice of a lease removed other than by dlock.Break (DEL,
//     FLUSHALL, expiry), or of a break notice missed while the link was down.
//   - Break notices on Redlock (package redlock).
//   - On the Lua-free protocol: shared and limited locks, WithReplicaAcks
//     and the Guard (all need scripts); one waiter woken per release (a
//     release wakes every waiter of the key); a break's retry after a
//     lost reply finding what it removed.
package redislock
