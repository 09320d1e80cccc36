// Package etcdlock is dlock's etcd backend: etcd's own lock recipe (a FIFO
// queue of leased keys per lock, the oldest entry holding it), with the
// entry's create revision as fencing token, and a Guard that fences data
// kept in etcd.
//
//	locker := etcdlock.New(client) // a *clientv3.Client; never closed here
//	lk, err := locker.Acquire(ctx, "inventory:42", dlock.WithTTL(10*time.Second))
//
// It is a driver (package dlock/driver) under a dlock.Engine: New takes
// its own options (WithPrefix, WithRequestTimeout) and the core's
// (dlock.WithObserver). Locks are exclusive, shared (dlock.WithShared,
// writer preference) or limited (dlock.WithLimit), in one FIFO queue per
// key. A Locker is a dlock.Lister and a dlock.Breaker. With the default
// empty prefix, dlock on KEY, `etcdctl lock KEY` and a concurrency.Mutex
// on "KEY" exclude each other (for keys without '/' or '%').
// docs/etcdlock.md describes the layout, key escaping, waits, modes,
// leases, receipts, List and Guard.
//
// # Guarantees
//
// Given an etcd cluster that keeps its data, and on the dlock core's terms
// for the local deadline (clock drift within its allowance):
//   - Mutual exclusion: an exclusive lock is handed out only when one
//     transaction showed its entry to be the oldest in its key's queue,
//     among the entries of all dlock Lockers and of the etcdctl and
//     concurrency.Mutex locks sharing its directory. Two locks on one key
//     through one Locker exclude each other.
//   - Modes: a shared lock holds only behind shared entries, a lock limited
//     to N only behind fewer than N entries, all limited to N: readers
//     never overlap a writer or a permit, at most N permits hold. A limit
//     that differs from the holders' fails with dlock.ErrLimitMismatch.
//   - Writer preference: no reader arriving after a queued writer holds
//     before it. FIFO in every mode (consecutive readers are let in
//     together); a release wakes only the waiters it can let in. A waiter
//     whose entry disappears (its lease expired) queues again, at the back.
//   - Lost() closes before etcd can expire the holder's lease (a lock is
//     never handed out with less than 2/3 of its TTL left, counted from the
//     request that last granted or renewed the lease), and as soon as the
//     entry's watch sees it deleted behind the holder's back.
//   - Tokens strictly increase across holders of a key, and across keys.
//   - ErrNotAcquired means a holder was read from etcd (by a wait whose
//     context ended, in its last second); a failed request or a silent
//     etcd is reported as such.
//   - Release never deletes another holder's entry; retried after a lost
//     reply it reports success (from its receipt); a release of a lost lock
//     reports dlock.ErrNotHeld.
//   - No later lock is handed an earlier attempt's entry (and token).
//   - A Guard applies the rule of package guard: once it admitted an
//     exclusive fence for a resource, no Guard on the same prefix admits an
//     older one, for as long as the cluster keeps its data; check, fence
//     record and operation are one transaction. A fence key holding no
//     fence is an error, never a reset. Every Guard call returns by its
//     context's deadline.
//   - A nil client (Locker or Guard) or a negative WithRequestTimeout
//     fails every call (dlock.ErrNilClient, dlock.ErrInvalidOption), never
//     with a panic.
//
// # Not guaranteed
//
//   - A holder paused past its lease can act after another was granted
//     the key: use the token with a Guard.
//   - A crashed holder keeps the key as long as its lease lives: whole
//     seconds rounded up, at least etcd's minimum (2s by default), extended
//     by every leader election. Lock.TTL reports the TTL etcd applied.
//   - Tokens are ordered only while the cluster keeps its data (not across
//     a rebuild from an older snapshot).
//   - A shared or limited TryAcquire overtaken between its two transactions
//     leaves its entry queued until its background delete; a later permit
//     may count it meanwhile.
//   - A permit waiting for 17 or more entries watches its whole queue
//     directory (it reads etcd again only when one of its entries leaves).
//   - etcdctl, concurrency.Mutex and dlock versions without modes see one
//     holder where several hold. A foreign lock on a name inside a dlock
//     key's directory blocks that key and is listed as its holder; a dlock
//     key with '/' or '%' does not exclude their lock of the same name.
//   - A held entry's deletion is seen at once only while its watch runs
//     (from 20ms after the grant; re-established after a backoff of up to
//     5s, at most 1000 times); otherwise the next renewal sees it.
//   - A release retried after its lease expired (or was revoked) reports
//     the lock lost even if its first request deleted the entry.
//   - An entry whose delete failed stays in its queue, ahead of later
//     waiters, until a retried delete succeeds or its lease expires.
//   - A Locker leaves behind the receipts of its latest releases and shared
//     leases with no entry, until their leases end.
//   - List is not a snapshot: the TTLs are read after the queues, and a key
//     released meanwhile is still listed.
//   - A Guard's write abandoned at its deadline may still take effect
//     (fenced). Guards on different prefixes do not see each other's
//     fences; a guard prefix of your own must not be a lock's queue
//     directory. A Txn must not write the guard's keys, and fails after
//     losing 16 races in a row with other writers of the fence.
package etcdlock
