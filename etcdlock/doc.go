// Package etcdlock implements dlock.Locker on etcd, with leases, a FIFO
// queue per key and the lock key's create revision as fencing token.
//
// Layout, compatible with etcd's own recipe (concurrency.Mutex and
// `etcdctl lock`): lock KEY is a queue of keys "<prefix>KEY/<lease id in
// hex>", each attached to its owner's lease; the entry with the lowest
// create revision holds the lock. With the default empty prefix, a Go
// service using dlock on KEY and a script running `etcdctl lock KEY` (or a
// concurrency.Mutex on "KEY") exclude each other.
//
// Keys with '/' or '%'. In etcd's recipe the queue of "a" is the prefix
// "a/", which also holds the entries of "a/b": a holder of "a/b" would
// block "a" and be reported as its holder. dlock therefore names the queue
// directory EscapeKey(KEY): every '%' becomes "%25" and every '/' "%2F", an
// injective encoding after which no directory contains another's entries.
// Keys without those two characters are unchanged, so the compatibility
// above holds for them; a key with '/' or '%' lives where etcdctl and
// concurrency.Mutex do not look (dlock's "a/b" is "a%2Fb/...", theirs is
// "a/b/..."), and the two do not exclude each other on it. List decodes the
// names (an etcdctl lock whose name has '/' is listed as it is, but List's
// prefix is matched against the encoded names).
//
// Acquire puts this attempt's entry in the queue (one transaction that
// also reads the head). A waiter then watches only the entry just ahead of
// it (the highest create revision below its own) and re-reads the queue
// when it is deleted, so a release wakes exactly one waiter and waiters are
// served in arrival order. While waiting it keeps its lease alive; if the
// lease expires anyway, the wait ends with an error instead of lasting
// forever. TryAcquire leaves the queue again unless it is first.
//
// Leases. Locks and waiters of one Locker that use the same TTL share a
// lease (like a concurrency.Session), but never two entries of the same
// key: two locks on one key through one Locker get different leases and
// exclude each other (two concurrency.Mutex sharing a session do not).
// Lease TTLs are whole seconds, rounded up, and etcd enforces a minimum
// (2s by default), so the server may hold a crashed holder's entry longer
// than the TTL, never shorter.
//
// Token: the create revision of the lock's entry. Revisions are global and
// only grow, so tokens strictly increase across holders of a key and across
// keys, for as long as the cluster keeps its data (etcd persists and
// replicates every write before acknowledging it).
//
// Renewal and loss. The watchdog keeps each lease alive (one keep-alive per
// lease, one transaction reading all entries, per tick) and loses a lock
// when its lease is gone (expired or revoked) or its entry was deleted or
// replaced; Lost() also closes at the local deadline when keep-alives fail,
// for example while the cluster has no leader.
//
// Release deletes the entry only if it still has the lock's create
// revision, so a retried release never deletes a newer holder's entry.
//
// Not guaranteed: a holder paused past its lease can still act after
// another holder was granted the key; use the token with a Guard.
package etcdlock
