// Package redisx holds the per-node Redis protocol shared by redislock
// (one deployment) and redlock (N independent masters): key layout, Lua
// scripts, owner-checked refresh and release, pipelined renewal, waiter
// queues and their wake-ups over pub/sub, release receipts, and listing.
// It is internal to dlock.
//
// # Key layout
//
// For lock KEY under prefix P, with T = HashTag(KEY):
//
//	P:{T}            the lock key; its value is one of
//	                   "<owner>|<token>|<metadata json>"   a lease, PX ttl
//	                   "|<token>"                          a release marker,
//	                                                       PX retention (1h)
//	                   "|<token>|<wait id>|<until ms>"     a release marker
//	                                                       reserving the key
//	P:{T}:waiters    sorted set of wait ids, scored by arrival (µs)
//	P:{T}:w:<id>     pub/sub channel (not a key) of waiter <id>
//	P:{T}:rel        list of release tokens (receipts), newest first
//	P:{T}:fence      Redlock's quorum counter, decimal
//
// The "{T}" hash tag keeps every key of a lock in one Cluster slot. A KEY
// starting with '}' would make an empty tag (Cluster then hashes the whole
// key, and the keys of one lock land in different slots), so such keys are
// written with a NUL byte in front ("P:{\x00}x}"); every other KEY is used
// as it is (see HashTag).
//
// Lease. <owner> is 32 random hex digits, fresh for every attempt, so the
// "<owner>|" prefix identifies one attempt exactly: owner checks compare
// it, and an attempt whose reply was lost can be undone knowing only the
// owner. <token> is decimal: redislock's acquire script issues marker + 1,
// or the server's time in µs when the key holds no marker; Redlock's grant
// writes 0 and its commit the quorum token (the largest max(counter,
// server time in µs) of the granting majority, plus one). The metadata is
// a JSON object (host, pid, and the caller's own).
//
// Release marker. A release replaces the lease with "|<token>", kept for
// the retention (FenceRetention): it is free for anyone, and it carries
// the key's last token (redislock's next token is marker + 1). When the
// release woke a queued waiter, the marker also names it and the end of
// its reservation, in the server's milliseconds ("|<token>|<wait id>|<until
// ms>"): until then everyone else is refused, and reported the
// reservation (Outcome.ReservedFor, MetaReservedForWaiter) rather than a
// holder. A Redlock release without a token (an attempt that failed
// before its commit) deletes the key, or leaves "|0|<wait id>|<until ms>"
// for the reservation's length when it woke a waiter.
//
// Waiters. A waiting Acquire has a wait id (redislock: 16 hex digits;
// Redlock: "<µs since epoch>-<8 hex digits>", the same on every node). Its
// failed attempts add it to P:{T}:waiters (ZADD NX, scored by its arrival
// in µs: Redlock's score is the one in its id, so every node orders its
// waiters alike) and push the set's expiry to a minute past the current
// lease or reservation. A release pops waiters in score order and
// PUBLISHes "1" on P:{T}:w:<id>: on a standalone server or Sentinel the
// first one that PUBLISH reports heard gets the reservation (departed ones
// are skipped, at most 16 per release); on a Cluster, where PUBLISH counts
// only the receivers on the node that ran it, the first one popped gets it
// (see wake_one in scripts.go). A waiter that leaves removes itself
// (ZREM, in the background, once no attempt of its own is in flight,
// retried with backoff for up to 30s when the link fails; see
// Waiters).
//
// Receipts. P:{T}:rel lists the tokens of the last Receipts release
// markers that an acquisition (redislock's acquire, Redlock's grant)
// overwrote, and expires ReceiptRetention after the latest. A release
// whose lease is gone reports success when its token is the current
// marker's or is in the receipts (or, in redislock, when the key holds the
// next lease taken from its marker, whose token is one more): the release
// happened, and this is a retry whose first reply was lost.
//
// Fence. Redlock's commit raises P:{T}:fence to at least the quorum token
// and keeps it for TTL + FenceRetention; grants read it, so the next
// majority, which shares a node with the last, issues a larger token.
//
// redislock's Guard keeps its own keys ("P:guard:{R}", "P:data:{R}:<name>");
// they are not part of this layout.
//
// # Retries
//
// Every script is safe to execute twice, as go-redis does when a reply is
// lost on the way back: an acquisition that finds its own owner's lease is
// granted that lease again, a release that finds its marker or receipt
// reports success, refresh and commit are idempotent.
//
// # Hung links
//
// Nothing a caller waits for blocks on a stalled link beyond what the
// caller allows: batch renewals report each server's results as they
// arrive, one pipeline per server (per master on a Cluster); the pub/sub
// hub never waits on the network when a subscription closes (its
// SUBSCRIBEs and UNSUBSCRIBEs are sent in order by a background worker);
// waiters are dequeued by a background worker per Node with a bounded
// backlog.
package redisx
