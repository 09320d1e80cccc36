// Package redlock implements dlock.Locker with the Redlock algorithm over N
// independent Redis masters (no replication between them), with a quorum
// fencing token.
//
// Acquire. The same key and a fresh owner are written with SET NX PX to
// every node in parallel, each node bounded by a per-node timeout that is a
// small fraction of the TTL (TTL × 0.05, within [50ms, 1s]; WithNodeTimeout
// overrides it). The attempt succeeds as soon as a majority granted and
// fails as soon as a majority has become impossible (taken or failing), so
// a slow or dead node never delays the answer. A lock is valid for
// TTL − elapsed − drift, with drift = TTL × 0.01 + 2ms (dlock.WithDrift
// changes it) and elapsed measured on the monotonic clock; a grant with no
// validity left is released and reported. Every node that granted or did
// not answer cleanly is released afterwards, in the background, when the
// attempt fails; late grants are released when they arrive.
//
// Fencing token. Each granting node returns max(its counter, its clock in
// µs). The client takes the maximum + 1 and writes it back (commit) to the
// granting majority before returning the lock; a majority must confirm.
// Any two majorities share a node, so the next holder reads a counter at
// least as high and gets a larger token. Tokens can repeat or go back only
// if nodes lose their counters: the shared node restarted without
// persistence (or failed over to a replica that missed the commit) within
// the counter's retention, and its clock, and the clocks of the rest of the
// new majority, are behind the previous token. Mitigations, as the Redis
// documentation advises for Redlock in general: run the nodes with
// appendfsync always, or keep a crashed node down for longer than the
// largest TTL before it rejoins. Guards treat an equal token from another
// owner as stale, so a repeat is refused rather than accepted twice.
//
// Renewal and loss. The watchdog extends the lease on all nodes (one
// pipeline per node per tick) and keeps the lock only while a majority
// extended it in time; otherwise Lost() closes at the local deadline, or at
// once when a majority reports the lease gone.
//
// Release. Compare-and-release (or the hand-over to the next waiter) goes
// to every node, including those that never answered the acquisition; the
// call returns once a majority released. Each node keeps the marker
// "|<token>" for FenceRetention (free for any later acquisition), so that
// a release sent again (a lost reply, or Release retried after an error)
// counts that node as released rather than reporting the lock lost.
//
// Waiting. A waiter subscribes to a channel of its own on every node (a
// majority must confirm) and its failed grants queue it on every node under
// the same score (its arrival time). A release on a node wakes the first
// queued waiter still listening and reserves the key for it for 100ms;
// since every node orders the queue alike, every node picks the same
// waiter, which then wins a majority instead of splitting the votes with a
// herd of woken contenders. Waiters also poll with jittered backoff bounded
// by the shortest lease or reservation left.
//
// Errors. A failed acquisition says, node by node, who granted, who holds
// the key (owner, host, pid) and which nodes failed and why: a
// *QuorumError, wrapped in a *dlock.NotAcquiredError when the key is held,
// so errors.Is(err, dlock.ErrNotAcquired) still works.
//
// Not guaranteed: Redlock's safety rests on bounded clock drift and bounded
// pauses; use the fencing token with a guard where correctness matters.
package redlock
