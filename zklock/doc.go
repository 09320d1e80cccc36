// Package zklock is dlock's ZooKeeper backend: Curator's lock recipe in Go,
// with fencing tokens and a loss signal, on github.com/go-zookeeper/zk.
//
//	conn, err := zklock.Connect(ctx, []string{"127.0.0.1:2181"}, 10*time.Second)
//	...
//	defer conn.Close()
//	locker := zklock.New(conn)
//	lk, err := locker.Acquire(ctx, "nightly-batch")
//
// # Recipe
//
// Lock KEY is the znode <prefix>/<EscapeKey(KEY)> (prefix DefaultPrefix).
// Each attempt creates an ephemeral sequential child named
// "_c_<owner>-<tag><sequence>", where the tag names the request's mode:
// "lock-" for an exclusive lock, "read-" for a shared one
// (dlock.WithShared) and "sem-<N>-" for a permit of a semaphore of N
// (dlock.WithLimit(N)). The children form the key's FIFO queue, lowest
// sequence first, and who holds the key follows from the queue alone:
//
//   - an exclusive node holds it when it is first;
//   - a shared node holds it when every node ahead of it is shared;
//   - a permit of N holds it when every node ahead of it is a permit of N
//     and fewer than N are.
//
// Each waiter watches only the node whose change can let it in, so a
// release wakes the waiters it admits, not the herd: an exclusive waiter
// the node just ahead of it; a shared waiter or a permit the last node
// ahead of it that it cannot share the key with; a permit behind permits
// of its own size the permit just ahead of it, which writes a "granted"
// mark into its node when it is granted with nodes queued behind it, or,
// for the first permit not admitted (when any holder's release admits
// it), the key's list of children. A permit waiting for a mark also
// looks at the queue again every third of its lease: the permit ahead
// may be admitted with its client frozen or dead, unable to write the
// mark, and would otherwise keep every permit behind it out until its
// session expired, with permits free. The owner id in the name lets a client
// whose create reply was lost find its node again instead of orphaning it
// (ZOOKEEPER-1262). The key's znode is a container node (ZooKeeper 3.6+):
// the server deletes it once it has no children (checked every
// znode.container.checkIntervalMs, a minute by default, at most
// znode.container.maxPerMinute, 10,000, a minute: raise it for more
// distinct keys than that), so keys used once leave nothing behind. A
// release deletes only its node: the next acquisition of the same key
// then finds the key's znode in place. Curator's InterProcessMutex and
// go-zookeeper's Lock name their nodes "lock-" too and are seen as
// exclusive holders.
//
// # Shared locks and semaphores
//
// Every reader and every permit is its own node, so its own lease, owner,
// token and Lost(); a crashed holder's node goes with its session. Writers
// have preference because the queue is FIFO: once a writer's node is
// queued, a reader that comes later is behind it, so TryAcquire(shared)
// is refused and Acquire(shared) waits until the writer has held the key
// and released it, or gave up (its node is deleted as its Acquire
// returns) or died (its node goes with its session). TryAcquire applies
// the same rules as Acquire and deletes its node when refused; it never
// waits in the queue. A request of another mode than the holders' waits
// (Acquire) or is refused naming the holders, up to 16 (TryAcquire).
//
// A permit whose limit differs from the holders' fails with an error
// wrapping dlock.ErrLimitMismatch that names both limits (TryAcquire, and
// Acquire whenever it looks at the queue: when it joins and each time it
// is woken). Queued permits of another limit that do not hold the key are
// treated like nodes of another mode: a permit waits behind them, and
// fails with ErrLimitMismatch if they hold the key when its turn comes.
//
// List reports each held key's mode, every holder (owner, token,
// metadata, mode, HeldFor), the limit of a semaphore and the number of
// waiters. HeldFor comes from the holder's dlock.MetaAcquired, stamped
// when its node was created: for a holder that queued, it includes the
// wait.
//
// # Fencing tokens
//
// A lock's token is its node's czxid, the zxid of the transaction that
// created it, whatever the lock's mode. A node is only granted once every
// node ahead of it it cannot share the key with is gone, so an exclusive
// holder's token is above every earlier holder's, reader, writer or
// permit. zxids increase across the whole ensemble, across leader
// elections (the epoch is their high half), and whatever happens to the
// key's znode. The sequence number is not a token: it counts per parent
// znode and restarts at zero when the container is deleted and created
// again, so a later holder can have a lower sequence than an earlier one.
//
// # Leases
//
// An ephemeral node lives as long as its session: the server expires the
// session when it has heard nothing from the client for the negotiated
// session timeout. So the lease a lock gets is derived from the session,
// not from dlock.WithTTL (which is validated and otherwise ignored): two
// thirds of the session timeout the ensemble granted, counted from the
// sending of the last request whose answer showed the node alive (the
// acquisition, then each renewal: a sync, which the server forwards to
// the leader, and an exists of the node). Lock.TTL reports it. The third
// kept back covers the time a follower takes to pass the session's
// activity on to the leader (half a tick, while the timeout is at least
// two ticks) and clock drift. While the client is disconnected (a hung
// server, a stalled link: "suspended" in Curator's terms) renewals fail
// and Lost() closes at that local deadline unless the client reconnects
// in time; when the client learns its session expired, or its node is
// deleted by someone else, Lost() closes at once (a watch on the node).
//
// A lock's node also goes as soon as its client closes the connection
// (Close ends the session), and a dead client's node stays until the
// ensemble expires its session: up to LingerOf the session timeout, twice
// it, after the client's last message (the leader expires a session the
// timeout after it last heard from it, rounded up to its tick, and a
// follower passes a client's activity on up to half a tick late). So
// dlock.RunOnce refuses on zklock, before running the job and with an
// error wrapping dlock.ErrInvalidOption, an atLeastFor above zero (a
// process that closes its connection as it exits would free the key at
// once, and a replica firing a moment later would run the job again) and
// an atMostFor below LingerOf the session timeout. Scheduled jobs run on
// ZooKeeper with atLeastFor 0: the job runs once among the replicas that
// fire while it runs, and a replica that fires after it ended runs it
// again; a backend whose leases outlive their client holds atLeastFor.
//
// The granted session timeout is read from the handshake by Connect;
// go-zookeeper does not expose it, so a connection made with zk.Connect
// needs WithSessionTimeout, and zklock then trusts the value given.
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
//     ensemble hangs; each request is also bounded by
//     WithRequestTimeout. A request that no server could be reached for,
//     or whose connection was reset or closed under it (the client gives
//     up on a silent server after two thirds of the session timeout),
//     fails with an error wrapping dlock.ErrUnavailable and the client's.
//   - An attempt abandoned mid-request (lost reply, context ended) leaves
//     no node behind: it is found by its owner id and deleted.
//   - dlock.RunOnce runs the job only with bounds a session honours
//     (atLeastFor 0, atMostFor at least LingerOf the session timeout) and
//     refuses others before running it: a runner that dies keeps the key
//     for at most atMostFor after its death.
//
// # Not guaranteed
//
//   - dlock.RunOnce's atLeastFor: refused (see Leases). Honouring it past
//     the runner's session would take state that outlives the session for
//     a bounded time: TTL nodes, which the servers offer only with
//     extendedTypesEnabled, or an expiry time in a persistent node that
//     replicas compare with their wall clocks. zklock uses neither.
//   - That a dead client's node is gone within LingerOf the session
//     timeout when a leader election happens meanwhile (the new leader
//     gives every session a fresh timeout), or when the servers'
//     minSessionTimeout is set below two ticks.
//   - That a semaphore's first waiting permit is woken only by releases:
//     it watches the key's children, so nodes joining or leaving the
//     queue behind it wake it too (it looks again and waits on).
//   - That a permit behind a waiting permit whose client froze is
//     admitted as soon as a permit is free: it notices within a third of
//     its lease (it looks again), not at once.
//   - Fair order among waiters of a key whose queue holds nodes foreign
//     to zklock: nodes it cannot parse are ignored.
//   - Shared or limited locks next to zklock versions from before they
//     existed: those do not recognize "read-" and "sem-" nodes and would
//     take an exclusive lock over readers. Upgrade every client of a key
//     before any of them uses WithShared or WithLimit on it.
//   - That a shared TryAcquire is never refused for a moment by an
//     exclusive TryAcquire on the same key: the writer's node is in the
//     queue, ahead of the reader's, for the instant of its attempt.
//   - Safety if the servers grant a shorter session timeout than a
//     connection from zk.Connect was told (WithSessionTimeout).
//   - Locks across sessions: all locks of a Locker share its connection's
//     session; when it expires, every one of them is lost.
//   - A lock longer than its session: WithTTL does not extend it.
//   - A clean run under Go's race detector across reconnects: go-zookeeper
//     v1.0.4 builds the request that re-sets a connection's watches from
//     the last zxid it saw, read without a lock while its new receive loop
//     may already write it (samuel/go-zookeeper#178, go-zookeeper/zk#35).
//     -race reports it when a connection with watches reconnects with
//     requests queued; dlock's test runs suppress that one report
//     (internal/testrun/gorace.supp). Its effect, watches re-set from a
//     zxid newer than a change made while disconnected, cannot hide a
//     deletion (a watch on a missing node fires). A semaphore's first
//     waiting permit, whose watch is on the key's children, compares
//     their last change (pzxid) at every probe (250ms), so a missed
//     release delays it by at most that; a permit waiting for the granted
//     mark of the permit ahead (a data change) may miss it until it looks
//     again, a third of its lease later.
package zklock
