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
// "redlock"; Locker.List implements dlock.Lister, Locker.Break
// dlock.Breaker.
//
// A lock is held when a majority of nodes granted it (SET NX PX, each node
// within a per-node timeout, WithNodeTimeout) and recorded its fencing
// token (proposed in the grant, or committed in a second round when the
// proposal fell short); it is valid for TTL − elapsed − drift. Acquisition, the token,
// renewal, break notices, release, waiting, errors, eviction, List and
// Break are described node by node in docs/redlock.md; each node holds
// the keys of package github.com/dlock-go/dlock/redislock/redisproto.
//
// # Guarantees
//
//   - While no fault breaks the assumptions below, at most one holder holds
//     a key: a lock is held only when a majority of nodes granted it, and
//     any two majorities share a node.
//   - Fencing tokens of a key strictly increase with each acquisition while
//     a majority of nodes keeps its counters.
//   - A slow, hung or dead minority of nodes delays neither an acquisition,
//     a release, nor a renewal: each waits only until a majority answered.
//   - Every call returns by its context's deadline; List too, with nodes
//     that have not answered counted as failed.
//   - A failed acquisition says, node by node, what happened (a
//     *QuorumError), and leaves nothing behind.
//   - No lock is handed out while a node reported, when first asked, that
//     it may evict keys (maxmemory set, maxmemory-policy not noeviction):
//     Acquire fails with an *EvictionError wrapping dlock.ErrUnsupported,
//     unless WithUnsafeEviction was given. Each node is asked once per
//     Locker, and an attempt waits for a majority of answers only: a node
//     that answers later is refused from the next attempt on, and one that
//     does not answer is asked again in the background.
//   - A dlock.Break reaches the broken holder promptly: a lock held for
//     more than 100 ms listens on every node's break channel, and once the
//     nodes holding its lease (or not answering) are fewer than a
//     majority, its Lost() closes within two node timeouts and a round
//     trip of the notice, not at its next renewal. A break that leaves the
//     lease on a majority (of nodes holding it or silent) leaves it held.
//     A lock held less than 100 ms, and a break published only on nodes
//     whose subscription failed, are found by the next renewal.
//
// # Not guaranteed
//
//   - Redlock's safety rests on bounded clock drift and bounded pauses;
//     use the fencing token with a guard where correctness matters.
//   - Tokens can repeat or go back when nodes lose their counters (a node
//     restarted without persistence within FenceRetention, its clock
//     behind the previous token, which is up to a second ahead of the
//     nodes' clocks; see docs/redlock.md).
//   - Shared and counted locks: dlock.WithShared and dlock.WithLimit are
//     refused with an error wrapping dlock.ErrUnsupported.
//   - Strict arrival order among waiters: a woken waiter that does not
//     claim its reservation within 100ms, and a waiter whose wake-up was
//     lost (it then polls), may be overtaken.
//   - A node's eviction policy set after it was first asked.
//   - A clean slate right after Release on every node: a node slower than
//     Release's grace may still hold the released lease, or a late grant
//     of it, for a moment; a forced Break then removes it there and names
//     its owner (List does not: it reports majorities).
//   - That a Break racing the holder's Release is told from a release:
//     both may report success (see Locker.Break).
package redlock
