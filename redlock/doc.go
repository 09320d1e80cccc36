// Package redlock implements dlock.Locker with the Redlock algorithm over N
// independent Redis masters (no replication between them), with a quorum
// fencing token.
//
//	l := redlock.New([]redis.UniversalClient{a, b, c}, redlock.WithPrefix("app"), dlock.WithObserver(obs))
//	err := dlock.Do(ctx, l, "inventory:42", func(ctx context.Context, lk *dlock.Lock) error { ... })
//
// New takes one client per master (use an odd number, 3 or 5) and, in one
// option list, redlock's options and the core's (dlock.WithObserver). A nil
// client, an empty list, a client listed twice or an option out of range
// give a Locker whose every call (Acquire, TryAcquire, List) fails with an
// error wrapping dlock.ErrNilClient or dlock.ErrInvalidOption. The Locker
// never closes the clients. It is built on dlock.Engine over a driver named
// "redlock"; Locker.List implements dlock.Lister.
//
// # Guarantees
//
//   - While no fault breaks the assumptions below, at most one holder holds
//     a key: a lock is held only when a majority of nodes granted it, and
//     any two majorities share a node.
//   - Fencing tokens of a key strictly increase with each acquisition while
//     a majority of nodes keeps its counters (see Fencing token).
//   - A slow, hung or dead minority of nodes delays neither an acquisition,
//     a release, nor a renewal: each waits only until a majority answered.
//   - Every call returns by its context's deadline; List too, with nodes
//     that have not answered counted as failed.
//   - A failed acquisition says, node by node, what happened, and leaves
//     nothing behind (see Errors and Acquire).
//   - No lock is handed out while a node reported, when first asked, that
//     it may evict keys (maxmemory set, maxmemory-policy not noeviction;
//     CONFIG GET, or INFO memory where CONFIG is denied): Acquire fails
//     with an *EvictionError wrapping dlock.ErrUnsupported, unless
//     WithUnsafeEviction was given. Each node is asked once per Locker,
//     and an attempt waits for a majority of answers only: a node that
//     answers later is refused from the next attempt on, and one that does
//     not answer is asked again in the background.
//   - A dlock.Break reaches the broken holder promptly: a lock held for
//     more than 100 ms listens on every node's break channel and, on a
//     notice, asks every node; once the nodes holding its lease (or not
//     answering) are fewer than a majority, its Lost() closes (within two
//     node timeouts and a round trip of the notice, not at its next
//     renewal). A break that
//     leaves the lease on a majority (of nodes holding it or silent)
//     leaves it held. A lock held less than 100 ms, and a break published
//     only on nodes whose subscription failed, are found by the next
//     renewal.
//
// # Not guaranteed
//
//   - Redlock's safety rests on bounded clock drift and bounded pauses;
//     use the fencing token with a guard where correctness matters.
//   - Tokens can repeat or go back when nodes lose their counters (see
//     Fencing token).
//   - Shared and counted locks: dlock.WithShared and dlock.WithLimit are
//     refused with an error wrapping dlock.ErrUnsupported.
//   - Strict arrival order among waiters: a woken waiter that does not
//     claim its reservation within 100ms, and a waiter whose wake-up was
//     lost (it then polls), may be overtaken (see Waiting).
//   - A node's eviction policy set after it was first asked.
//   - A clean slate right after Release on every node: a node slower than
//     Release's grace (see Release) may still hold the released lease, or
//     a late grant of it, for a moment; a forced Break then removes it
//     there and names its owner (List does not: it reports majorities).
//
// # Acquire
//
// The same key and a fresh owner are written with SET NX PX to every node
// in parallel, each node bounded by a per-node timeout that is a small
// fraction of the TTL (TTL × 0.05, within [50ms, 1s]; WithNodeTimeout
// overrides it). A node that has not answered when its timeout passes
// counts as failed ("no answer"), whether or not its client honours the
// context (a default go-redis client on a stalled link waits for its read
// timeout and retries). The attempt succeeds as soon as a majority granted
// and fails as soon as a majority has become impossible (taken, failing or
// silent), so a slow, hung or dead node never delays the answer. A lock is
// valid for TTL − elapsed − drift, with drift = TTL × 0.01 + 10ms
// (dlock.WithDrift changes it) and elapsed measured on the monotonic clock
// from the start of the attempt: the core counts the lock's local deadline
// that way and releases a grant with no validity left, reporting it as
// transient; the driver itself skips the commit of a grant whose whole TTL
// has run out. Every node that granted or did not answer cleanly is
// released afterwards, in the background, when the attempt fails; late
// grants are released when they arrive. A grant executed twice for the same
// owner (a client resending a request whose reply was lost) is granted
// again and leaves the lease as it is.
//
// # Fencing token
//
// Each granting node returns max(its counter, its clock in µs). The client
// takes the maximum + 1 and writes it back (commit) to the granting
// majority before returning the lock; a majority must confirm. Any two
// majorities share a node, so the next holder reads a counter at least as
// high and gets a larger token. Tokens can repeat or go back only if nodes
// lose their counters: the shared node restarted without persistence (or
// failed over to a replica that missed the commit) within the counter's
// retention, and its clock, and the clocks of the rest of the new majority,
// are behind the previous token. Mitigations, as the Redis documentation
// advises for Redlock in general: run the nodes with appendfsync always, or
// keep a crashed node down for longer than the largest TTL before it
// rejoins. Guards treat an equal token from another owner as stale, so a
// repeat is refused rather than accepted twice.
//
// # Renewal and loss
//
// The watchdog extends the lease on all nodes (one pipeline per node per
// tick, the nodes concurrently) and keeps the lock only while a majority
// extended it in time; otherwise Lost() closes at the local deadline, or at
// once when a majority reports the lease gone (or a break notice finds it
// gone, see Guarantees). Each lock counts as renewed
// as soon as a majority extended it: a hung minority delays nothing, and a
// node whose previous renewal is still running is not sent another one.
//
// # Release
//
// Compare-and-release (or the hand-over to the next waiter) goes to every
// node, including those that never answered the acquisition. It succeeds
// once a majority released; the call then waits, within its ctx, a grace
// (four times what the majority took, at least 20ms, within the node
// timeout) for the other nodes to answer too, and for the acquisition's
// grants still in flight (one that lands after its node answered the
// release is released there again), so that a List or Break right after
// Release does not find the lease on a node that was merely a little
// slower. A hung node costs that grace (or ctx), never the success, and its
// release goes on in the background. Each node keeps the marker "|<token>"
// for FenceRetention (free for any later acquisition), and a grant that
// overwrites a marker records its token in the key's receipts on that node
// (the last 8 hand-overs, kept a minute after the latest), so that a
// release sent again (a lost reply, or Release retried after an error)
// counts that node as released rather than reporting the lock lost, also
// after the key changed hands. A retry after more than 8 hand-overs, or
// more than a minute after the latest, is reported as a lease no longer
// held.
//
// # Waiting
//
// A waiter subscribes to a channel of its own on every node (a majority
// must confirm) and its failed grants queue it on every node under the same
// score (its arrival time). A release on a node wakes the first queued
// waiter still listening and reserves the key for it for 100ms; since every
// node orders the queue alike, every node picks the same waiter, which then
// wins a majority instead of splitting the votes with a herd of woken
// contenders. Waiters also poll with jittered backoff bounded by the
// shortest lease or reservation left. A waiter that leaves (Acquire
// returned) is removed from the queue of every node in the background, once
// none of its grants is in flight. While a key is reserved, anyone else's
// attempt fails with a *dlock.NotAcquiredError whose holder has no owner:
// its Metadata[MetaReservedForWaiter] is the waiter's id and its TTL the
// shortest reservation left; the QuorumError says "reserved for waiter
// <id>" for those nodes.
//
// # Errors
//
// A failed acquisition says, node by node, who granted, who holds the key
// (owner, host, pid), whose lease was gone, which nodes failed and why, and
// which did not answer: a *QuorumError, wrapped in a *dlock.NotAcquiredError
// when the key is held (errors.Is(err, dlock.ErrNotAcquired) still works;
// the QuorumError is its Cause). The NotAcquiredError's Holders are the
// holders the refusing nodes reported, one per owner (or reserved waiter),
// the one seen on most nodes first, each with the highest token and the
// shortest lease left it was seen with. They are the holders seen by the
// time the verdict was decided: once one owner is seen on a majority, the
// nodes not yet heard are reported as "no answer yet" and their holders
// are not listed. The QuorumError wraps
// dlock.ErrTransient, and Acquire tries again, when no holder was seen and
// the attempt may succeed if repeated: nodes did not answer in time, or a
// majority granted but the commit could not reach a majority, or a split
// vote: no owner is seen on (or could, counting the nodes that did not
// answer, be on) a majority, so nobody holds the key. Nodes
// answering with errors that alone make a majority impossible end Acquire
// at once. When the nodes that refused or reset their connections or did
// not answer are enough on their own to make a majority impossible, the
// error wraps dlock.ErrUnavailable too.
//
// # Listing
//
// List (dlock.Lister) scans every node and reports the keys a majority of
// nodes holds for one owner, sorted by key, each with that one holder (the
// highest token and the shortest lease left among those nodes) and Waiters
// -1: the queues are not read.
//
// # Layout
//
// Each node holds the keys of a redislock deployment (plus the counter
// "<prefix>:{<key>}:fence"), written by scripts of its own: the layout,
// value grammar and scripts are documented, and versioned, in package
// github.com/dlock-go/dlock/redislock/redisproto.
package redlock
