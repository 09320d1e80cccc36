// Package etcdlock implements dlock.Locker on etcd, with leases, a FIFO
// queue per key and the lock key's create revision as fencing token, and
// a Guard that fences data kept in etcd.
//
// It is a driver of the dlock core (package dlock/driver) under a
// dlock.Engine: New's options are etcdlock's own (WithPrefix,
// WithRequestTimeout) and the core's (dlock.WithObserver). Locks are
// exclusive, shared (dlock.WithShared: read-write locks with writer
// preference) or limited (dlock.WithLimit: semaphores), all in one FIFO
// queue per key. A Locker is a dlock.Lister.
//
// # Layout
//
// Compatible with etcd's own recipe (concurrency.Mutex and `etcdctl lock`):
// lock KEY is a queue of keys "<prefix>KEY/<lease id in hex>", each
// attached to its owner's lease; the entry with the lowest create revision
// holds the lock. With the default empty prefix, a Go service using dlock
// on KEY and a script running `etcdctl lock KEY` (or a concurrency.Mutex on
// "KEY") exclude each other.
//
// # Keys with '/' or '%'
//
// In etcd's recipe the queue of "a" is the prefix "a/", which also holds
// the entries of "a/b": a holder of "a/b" blocks "a" and is reported as its
// holder. dlock therefore names the queue directory EscapeKey(KEY): every
// '%' becomes "%25" and every '/' "%2F", an injective encoding after which
// no dlock directory holds another's entries, so dlock keys never contend
// with each other. etcd's recipe knows no escaping: between a dlock key K
// and an etcdctl or concurrency.Mutex lock named N (under the same prefix)
// exactly this holds.
//   - N equal to EscapeKey(K): they share a directory and exclude each
//     other. For keys without '/' or '%' this is N == K, the compatibility
//     above; for K "a/b" it is N "a%2Fb", and for K "a%" it is N "a%25".
//   - N extending EscapeKey(K) with "/...": N's entries lie inside K's
//     directory, so N blocks K and is reported as its holder, while K does
//     not block N. A Mutex on "d/e" blocks dlock's "d"; one on "a%25/x"
//     blocks dlock's "a%".
//   - Any other N does not contend with K; in particular dlock's "a/b" and
//     a Mutex on "a/b" do not exclude each other.
//
// dlock does not skip the foreign entries that lie deeper than its
// directory's direct children: TryAcquire compares the whole directory in
// its one transaction, and the head and the entry ahead are single range
// reads with limit 1; etcd cannot restrict either to direct children, so
// skipping would take reading the whole queue and a second round trip.
// List decodes the names (an etcdctl lock whose name has '/' is listed as
// it is, but List's prefix is matched against the encoded names).
//
// # Acquiring and waiting
//
// TryAcquire is one transaction (after a lease grant or renewal when no
// fresh shared lease is at hand): put this attempt's entry if the queue is
// empty, else read its head (the holder); nothing is left behind when the
// key is held. Acquire puts its entry in the queue (one transaction that
// also reads the head) and then watches only the entry just ahead of it
// (the highest create revision below its own), re-reading the queue when it
// is deleted, so a release wakes exactly one waiter and waiters are served
// in arrival order. Shared and limited attempts differ as described under
// Shared and limited locks. While waiting it keeps its lease alive and checks every
// 250ms, with point reads, that the entry ahead, its own entry and the
// holder are still there. If its own entry disappears (its lease expired,
// say after a renewal a loaded machine sent late, or was revoked) the
// attempt wraps dlock.ErrTransient and Acquire queues again, at the back,
// on a live lease, while its context allows (a context that ends before
// then gets the context's error with the expiry). When
// the context ends while etcd answers, Acquire returns at once a
// *dlock.NotAcquiredError naming the holder and removes its entry in the
// background; when a request fails, or etcd has not answered for a second
// (a hung server or a stalled link), it returns that error instead, never
// ErrNotAcquired. A request that etcd itself timed out ("etcdserver:
// request timed out", a leader lost or changed: a slow disk, a moment
// without quorum) wraps dlock.ErrTransient: its entry, if it was put after
// all, is deleted in the background, and Acquire tries again while its
// context allows; TryAcquire returns the error. An attempt, renewal or
// release whose connection was refused or reset (gRPC's status
// Unavailable) fails with an error wrapping dlock.ErrUnavailable and that
// status.
//
// # Shared and limited locks
//
// Every entry records its mode in its value ("mode":"shared", or
// "mode":"limited" with "limit":N; an exclusive entry records none, as
// before modes existed, and so do etcdctl's and concurrency.Mutex's
// entries, which count as exclusive). Which entries hold follows from the
// queue's order alone:
//   - an exclusive entry holds when it is first;
//   - a shared entry holds when every entry ahead of it is shared;
//   - an entry limited to N holds when every entry ahead of it is limited
//     to N and fewer than N are ahead.
//
// The holders are therefore the head of the queue and, behind a shared
// head, the shared entries up to the first that is not, or, behind a head
// limited to N, the entries limited to N up to the first that is not, N
// at most. Each holder is its own entry on its own lease (two locks of one
// Locker on one key never share a lease), with its own owner, token,
// expiry and Lost(): a reader whose process dies loses its entry when its
// lease expires, without touching the other readers.
//
// Writer preference follows from the order: a reader that arrives behind
// a waiting writer queues behind it and waits, however many readers hold.
// A writer that gives up removes its entry (as any waiter whose context
// ends); one whose process dies keeps readers out until its lease expires.
//
// A shared or limited TryAcquire reads the whole queue in the transaction
// that would put its entry into an empty queue; if its entry would hold
// behind the entries read, it joins the queue in a second transaction (put
// the entry and read the entries ahead of it) and holds if those let it,
// so readers or permits arriving together all join. Only an entry that
// conflicts with it and arrived between the two transactions (a writer, a
// permit that fills the semaphore) refuses it then, and its entry is
// removed again at once. Otherwise it never leaves an entry behind: a
// shared TryAcquire behind a writer already waiting is refused without ever
// entering the queue. An exclusive TryAcquire is unchanged (one
// transaction); when the head it read is shared or limited it reads the
// queue once more, to name every holder in its *dlock.NotAcquiredError.
//
// A shared or limited Acquire puts its entry and reads the whole queue in
// one transaction, and while it does not hold it waits for the deletion of
// the entries that can let it in, and only those: a reader, the last entry
// ahead of it that is not shared; an entry limited to N, the last entry
// ahead that is not limited to N if one is among the N entries just ahead
// of it, else those N entries (any of them leaving lets it in; an entry
// further ahead leaving does not). Each entry is watched by its key, up
// to 16 of them; more by one watch on the queue's directory, whose other
// events are ignored. Its checks every 250ms (see Acquiring and waiting)
// read, when it waits for several entries, every key ahead of it.
//
// A limited request fails with an error wrapping dlock.ErrLimitMismatch,
// naming both limits, when it finds the key's holders limited to another
// number: at its attempt, or while it waits (when the head it re-reads has
// changed); a waiting one then removes its entry. Entries of another limit
// that are queued but do not hold yet are not a mismatch: a request queued
// behind them waits for them as for any entry of another mode, and fails
// if they come to hold before it. A request of another mode than the
// holders' waits (Acquire) or is refused with a *dlock.NotAcquiredError
// naming every holder (TryAcquire).
//
// # Leases
//
// Locks and waiters of one Locker that ask for the same lease TTL (in
// whole seconds) share a lease (like a concurrency.Session), but never two
// entries of the same key: two locks on one key through one Locker get
// different leases and exclude each other (two concurrency.Mutex sharing a
// session do not). Lease TTLs are whole seconds, rounded up, and etcd
// enforces a minimum (2s by default). A lock's TTL is its lease's as etcd
// applied it (Lock.TTL reports it: 2s for a WithTTL(300ms) lock on a
// default server): the watchdog renews the lease every third of it and
// Lost() closes by the end of it, counted from the start of the request
// that last granted or renewed the lease. A shared lease is reused without
// a round trip only while less than a third of its TTL has passed since
// then; otherwise it is renewed first, so a lock is never handed out with
// less than 2/3 of its TTL left.
//
// A lease's slot for a key is freed only when its entry is known to be
// deleted. An entry whose delete failed (a release or a cancelled wait on
// a broken link) or whose creation has an unknown outcome (a lost reply)
// keeps its slot, so no later lock can take it over with the same token,
// and its delete (by create revision, or by value for a creation whose
// reply was lost) is retried before the next attempt on that key and with
// each keep-alive of its lease, so it does not linger while other locks
// keep the shared lease alive. A lease that had a creation with an unknown
// outcome takes no new entries and is revoked once it has no live entry
// left, which also removes a creation that takes effect late.
//
// # Tokens
//
// The token is the create revision of the lock's entry. Revisions are
// global and only grow, so tokens strictly increase across holders of a key
// and across keys, for as long as the cluster keeps its data (etcd persists
// and replicates every write before acknowledging it). In every mode an
// entry holds only once every entry ahead of it that does not share with
// it is gone, and entries created after it queue behind it: a writer's
// token is above the token of every lock granted on the key before it,
// shared, limited or exclusive.
//
// # Renewal and loss
//
// A held lock watches its own entry (from its create revision + 1, so a
// delete before the watch is set up is seen too; the watch starts 20ms
// after the lock is handed out, so a lock released sooner costs none) and
// is lost at once, with an error wrapping dlock.ErrNotHeld, when the entry
// is deleted: its lease was revoked or expired, or someone deleted the key.
// The watchdog keeps each lease alive (per lease: one keep-alive and one
// transaction per 128 entries reading its entries, each lease reported as
// soon as it answered) and also loses a lock whose lease or entry is gone;
// Lost() also closes at the local deadline when keep-alives fail, for
// example while the cluster has no leader.
//
// # Release
//
// Release deletes the entry only if it still has the lock's create
// revision, so a retried release never deletes a newer holder's entry, and
// in the same transaction puts a receipt on the entry's lease:
// "<prefix>\x00dlock-released/<lease hex>/<create revision>". etcd cannot
// tell who deleted a key; the receipt can. A release that finds the entry
// gone returns nil if its receipt exists (an earlier release of this lock
// deleted it and the reply was lost), and otherwise an error wrapping
// dlock.ErrNotHeld: the lock had been lost (its lease expired or was
// revoked, or someone deleted the entry), however long the link stalled and
// whatever the entry's watch had seen. The retried delete of an entry whose
// release failed writes the receipt the same way, and a Locker settles such
// releases before it revokes a lease of its own. Receipts are not locks:
// dlock keys cannot contain NUL, so no queue directory holds them (for
// prefixes without NUL), and List skips them (etcdctl and concurrency.Mutex
// see them only under a lock name that itself contains
// "\x00dlock-released"). A receipt lives at most as long as its lease; once
// its release's outcome is known it is deleted by the next release or
// retried delete of the same Locker (in that request's transaction), so a
// Locker leaves only the receipts of its most recent releases and of
// releases whose outcome is still unknown.
//
// Every request of a Locker honours the caller's context and is bounded by
// the request timeout (WithRequestTimeout); background clean-up is bounded
// by dlock.DefaultReleaseTimeout. A Guard's requests are bounded by the
// caller's context only.
//
// # Listing
//
// List (dlock.Lister) reads every queue under a prefix in one range read
// and reports each held key, sorted, with its mode (its head's) and, for a
// semaphore, its limit, every holder (owner, token, metadata, mode, and
// the time left on its lease, one TimeToLive request per lease, and
// HeldFor from its dlock.MetaAcquired, stamped when its entry was put: for
// a holder that queued, it includes the wait) and the number of entries
// that do not hold (Waiters).
//
// # Guard
//
// A Guard (guard.Guard) keeps, under its prefix (DefaultGuardPrefix,
// "dlock%guard/", or WithGuardPrefix), each resource's highest accepted
// fence at FenceKey(resource) and its named values at
// FenceKey(resource)+"\x00"+name. Put, Get and Txn (any etcd operations)
// are each one transaction that compares the fence key's mod revision
// with the one just read and was decided by the rule of package guard on
// what was read; an exclusive fence that becomes the highest is written
// in the same transaction. A refusal runs nothing, returns a
// *dlock.StaleTokenError and reports a dlock.EventRejected to the Observer
// given to NewGuard with dlock.WithObserver.
//
// # Guarantees
//
// Given an etcd cluster that keeps its data, and on the dlock core's terms
// for the local deadline (clock drift within its allowance):
//   - Mutual exclusion: an exclusive lock is handed out only when one etcd
//     transaction showed its entry to be the oldest (lowest create
//     revision) in its key's queue, among the entries of all dlock Lockers
//     and of the etcdctl and concurrency.Mutex locks that share its
//     directory (see Keys with '/' or '%'). Two locks on one key through
//     one Locker exclude each other.
//   - Modes: a shared lock is handed out only when one transaction showed
//     every entry ahead of its own to be shared, and a lock limited to N
//     only when it showed fewer than N entries ahead, all limited to N: so
//     readers never overlap a writer or a permit, and at most N permits
//     hold at once. A limited request whose limit differs from the
//     holders' fails with dlock.ErrLimitMismatch.
//   - Writer preference: once a writer waits (its entry is queued), no
//     reader that arrives later holds before it.
//   - Lost() closes before etcd can expire the holder's lease: a lock's
//     TTL is the one etcd applied to its lease, and it counts from the
//     start of the request that last granted or renewed the lease, so it
//     is never handed out with less than 2/3 of its TTL left.
//     An entry deleted behind the holder's back (a revoked or expired
//     lease, an operator's delete) closes Lost() as soon as the entry's
//     watch sees the deletion.
//   - Fencing tokens strictly increase across holders of a key, and across
//     keys.
//   - FIFO: waiters are served in arrival order, in every mode (a reader
//     or permit that arrived later never holds before an earlier waiter
//     that does not hold; consecutive readers are let in together). A
//     release wakes only the waiters it can let in: for exclusive and
//     shared waiters, one entry's waiter(s); a permit's release, the
//     permits waiting within N entries of it. A wait whose own entry
//     disappears ends with an error.
//   - ErrNotAcquired means the call read a holder from etcd; a wait whose
//     context ends reports it only if etcd answered in the wait's last
//     second. A failed request or a silent etcd is reported as such.
//   - Release never deletes another holder's entry; a retried release
//     whose first reply was lost reports success (from its receipt), and
//     a release of a lock that was lost reports dlock.ErrNotHeld.
//   - No later lock is handed an earlier attempt's entry (and token): an
//     entry's slot on its lease is freed only once the entry is known to
//     be deleted.
//   - A Guard applies the rule of package guard: once it admitted an
//     exclusive fence for a resource, no Guard on the same prefix admits
//     an older one for it, for as long as the cluster keeps its data; the
//     check, the record of the fence and the operation are one
//     transaction. A fence key holding something that is not a fence is
//     an error, never a reset of the resource's fences. Every Guard call
//     returns by its context's deadline.
//   - A nil client, or a negative WithRequestTimeout, makes every call of
//     the Locker fail with an error (dlock.ErrNilClient,
//     dlock.ErrInvalidOption); a Guard on a nil client fails every call
//     with dlock.ErrNilClient. Neither panics.
//
// # Not guaranteed
//
//   - A holder paused past its lease can still act after another holder
//     was granted the key; use the token with a Guard.
//   - A crashed holder keeps the key for as long as its lease lives, which
//     can be longer than the TTL asked for: whole seconds rounded up, at
//     least etcd's minimum lease TTL (2s by default), and etcd extends
//     every lease when it elects a new leader. Lock.TTL reports the lease
//     etcd applied, not the one asked for.
//   - Shared and limited TryAcquire on a key that readers or permits hold
//     takes two transactions; an entry of a refused one that a writer or
//     permit overtook between them is in the queue until its delete (in
//     the background) succeeds, and a later permit may count it meanwhile.
//   - A permit of a semaphore of more than 16 that waits for 17 or more
//     entries watches its queue's directory: every change to the queue
//     reaches it (it reads etcd again only when one of its entries
//     leaves). Up to 16, each entry is watched by its key.
//   - etcdctl, concurrency.Mutex and dlock versions without modes read
//     only the head: they exclude dlock's readers and permits correctly
//     (they hold only when first) but see one holder where several hold.
//   - Exclusion with etcdctl and concurrency.Mutex locks holds only as
//     described under Keys with '/' or '%': their locks on names inside a
//     dlock key's directory block that key and are reported as its holder,
//     and a dlock key with '/' or '%' does not exclude their lock of the
//     same name.
//   - Tokens are ordered only for as long as the cluster keeps its data: a
//     cluster rebuilt from an older snapshot can hand out tokens again.
//   - A held entry's deletion is seen at once only while its watch runs:
//     the watch starts 20ms after the lock is handed out (from the create
//     revision + 1, so an earlier deletion is seen then), and a watch that
//     ends (a compaction, a cancelled watch) is re-established after a
//     backoff of up to 5s, at most 1000 times; otherwise the next renewal
//     sees it.
//   - A release retried after its lease expired (or an operator revoked
//     it) finds no receipt and reports the lock lost even if its first
//     request had deleted the entry.
//   - An entry whose delete failed (a release or a cancelled wait on a
//     broken link) stays in its queue, ahead of later waiters, until a
//     retried delete succeeds or its lease expires.
//   - A Locker leaves keys and leases behind: the receipts of its most
//     recent releases (each until its lease ends) and shared leases with
//     no entry left (until they expire).
//   - List is not a snapshot of the holders' leases: the TTLs are read
//     after the queues, and a key released meanwhile is still listed.
//   - A Guard's write abandoned at its context's deadline may still take
//     effect (it stays fenced). Guards on different prefixes do not see
//     each other's fences, and a guard prefix of your own must stay out
//     of lock queues (a prefix "jobs/" is the queue directory of a lock
//     named "jobs", whose holder would be blocked by the guard's keys;
//     the default prefix is never a dlock queue directory). A Txn's operations must not write the guard's own
//     keys. A Txn that keeps losing races with other writers of the same
//     fence (16 in a row) fails with an error.
package etcdlock
