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
// "_c_<owner>-lock-<sequence>"; the child with the lowest sequence holds
// the lock, and each waiter watches only the child just ahead of it, so a
// release wakes one waiter (no herd) and waiters are served in FIFO order.
// The owner id in the name lets a client whose create reply was lost find
// its node again instead of orphaning it (ZOOKEEPER-1262). The key's znode
// is a container node (ZooKeeper 3.6+): the server deletes it once it has
// no children (checked every znode.container.checkIntervalMs, a minute by
// default, at most znode.container.maxPerMinute, 10,000, a minute: raise
// it for more distinct keys than that), so keys used once leave nothing
// behind. A release deletes only its node: the next acquisition of the
// same key then finds the key's znode in place.
//
// # Fencing tokens
//
// A lock's token is its node's czxid, the zxid of the transaction that
// created it. zxids increase across the whole ensemble, across leader
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
// The granted session timeout is read from the handshake by Connect;
// go-zookeeper does not expose it, so a connection made with zk.Connect
// needs WithSessionTimeout, and zklock then trusts the value given.
//
// # Guarantees
//
//   - Mutual exclusion while the ensemble keeps a quorum: one node is
//     first in a key's queue at a time.
//   - Tokens strictly increase each time a key is granted.
//   - Lost() closes before the session can expire on the server, as long
//     as the client's clock does not run more than a few percent slow
//     against the servers' (the drift allowance), so before another
//     client can be granted the key.
//   - Every call returns by its context's deadline, also when the
//     ensemble hangs; each request is also bounded by
//     WithRequestTimeout.
//   - An attempt abandoned mid-request (lost reply, context ended) leaves
//     no node behind: it is found by its owner id and deleted.
//
// # Not guaranteed
//
//   - Shared and limited modes (ErrUnsupported).
//   - Safety if the servers grant a shorter session timeout than a
//     connection from zk.Connect was told (WithSessionTimeout).
//   - Locks across sessions: all locks of a Locker share its connection's
//     session; when it expires, every one of them is lost.
//   - A lock longer than its session: WithTTL does not extend it.
package zklock
