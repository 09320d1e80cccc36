// Package zklock is dlock's ZooKeeper backend: Curator's lock recipe in Go,
// with fencing tokens and a loss signal, on github.com/go-zookeeper/zk.
//
//	conn, err := zklock.Connect(ctx, []string{"127.0.0.1:2181"}, 10*time.Second)
//	...
//	defer conn.Close()
//	locker := zklock.New(conn)
//	lk, err := locker.Acquire(ctx, "nightly-batch")
//
// Lock KEY is the znode <prefix>/<EscapeKey(KEY)> (prefix DefaultPrefix), a
// container node (ZooKeeper 3.6+) the server removes once empty. Each
// attempt is an ephemeral sequential child of it, named for its owner and
// mode; the children form the key's FIFO queue, shared by exclusive locks,
// shared locks (dlock.WithShared) and semaphores (dlock.WithLimit). Writers
// have preference: a request queued after a waiting writer waits for it. A
// permit whose limit differs from the holders' fails with an error wrapping
// dlock.ErrLimitMismatch. Each waiter watches only the node whose change
// can let it in, so a release wakes the waiters it admits, not the herd.
//
// A lock's token is its node's czxid. Its lease is LeaseOf the session
// timeout the ensemble granted (dlock.WithTTL is validated and otherwise
// ignored), which Connect reads from the handshake; a connection made with
// zk.Connect needs WithSessionTimeout. The recipe, the modes, tokens,
// leases and every limit below are described in docs/zklock.md.
//
// # Guarantees
//
//   - Mutual exclusion while the ensemble keeps a quorum: one node is
//     first in a key's queue at a time; no exclusive holder together with
//     any other; at most N permits of a semaphore of N.
//   - Tokens strictly increase each time a key is granted.
//   - Lost() closes before the session can expire on the server, as long
//     as the client's clock does not run more than a few percent slow
//     against the servers' (the drift allowance), so before another
//     client can be granted the key.
//   - Every call returns by its context's deadline, also when the
//     ensemble hangs; each request is also bounded by WithRequestTimeout.
//     A request that no server could be reached for, or whose connection
//     was reset or closed under it, fails with an error wrapping
//     dlock.ErrUnavailable and the client's.
//   - An attempt abandoned mid-request (lost reply, context ended) leaves
//     no node behind: it is found by its owner id and deleted.
//   - dlock.RunOnce runs the job only with bounds a session honours
//     (atLeastFor 0, atMostFor at least LingerOf the session timeout) and
//     refuses others before running it, with an error wrapping
//     dlock.ErrInvalidOption: a runner that dies keeps the key for at most
//     atMostFor after its death.
//
// # Not guaranteed
//
//   - dlock.RunOnce's atLeastFor: refused (a node goes with its session).
//   - That a dead client's node is gone within LingerOf the session timeout
//     across a leader election, or with the servers' minSessionTimeout
//     below two ticks.
//   - That a semaphore's first waiting permit is woken only by releases
//     (any change to the key's children wakes it).
//   - That a permit behind a waiting permit whose client froze is admitted
//     as soon as a permit is free: it notices within a third of its lease.
//   - Fair order among waiters of a key whose queue holds nodes foreign to
//     zklock: nodes it cannot parse are ignored.
//   - Shared or limited locks next to zklock versions without them, which
//     would take an exclusive lock over readers: upgrade every client of a
//     key before any of them uses WithShared or WithLimit on it.
//   - That a shared TryAcquire is never refused for a moment by an
//     exclusive TryAcquire on the same key.
//   - Safety if the servers grant a shorter session timeout than a
//     connection from zk.Connect was told (WithSessionTimeout).
//   - Locks across sessions: all locks of a Locker share its connection's
//     session; when it expires, every one of them is lost.
//   - A lock longer than its session: WithTTL does not extend it.
//   - A clean run under Go's race detector across reconnects: go-zookeeper
//     v1.0.4 reads the last zxid it saw without a lock when it re-sets
//     watches (go-zookeeper/zk#35); dlock's test runs suppress that report
//     (internal/testrun/gorace.supp). A deletion is never missed; a missed
//     release delays a semaphore's first waiting permit by at most a probe
//     (250ms), a missed granted mark a permit by at most a third of its
//     lease.
package zklock
