// Package redisproto is dlock's Redis wire protocol: key layout, value
// grammar and scripts, shared by redislock and redlock; most code should
// use package redislock.
//
// A Node speaks the protocol to one Redis deployment (standalone, Sentinel
// or Cluster): redislock uses one, redlock one per independent master. On
// top of the scripts it renews leases in pipelines (RefreshBatch), lists
// held locks (List), wakes waiters over pub/sub (Watch) and removes
// departed waiters from their queues (Waiters). The package is public so
// that redlock, a module of its own, can share it, and so that the layout
// is documented in one place for operators and tools that read dlock's
// keys; its Go API serves redislock and redlock and changes with them.
//
// # Layout, version 2
//
// The layout below is ProtocolVersion 2. For lock KEY under prefix P (the
// lockers' WithPrefix, default "dlock"), with T = HashTag(KEY):
//
//	key            type        holds                                expires
//	P:{T}          string      the lock value (below)               with the lease or marker (below)
//	P:{T}:waiters  sorted set  wait ids, scored by arrival (µs)     a minute past the lease or reservation
//	P:{T}:rel      list        receipts: tokens, newest first       ReceiptRetention after the latest
//	P:{T}:fence    string      Redlock's quorum counter, decimal    TTL + FenceRetention after a commit
//	P:{T}:h        sorted set  a group's holders: owners, scored    with the group's latest holder
//	                           by the end of their lease (ms,
//	                           server clock)
//	P:{T}:hd       hash        a group's holders: owner ->          with the group's latest holder
//	                           "<token>|<metadata>"
//	P:{T}:wr       sorted set  waiting writers: waiter ids          with the latest registration
//	                           (Request.Waiter), scored by the end
//	                           of their registration (ms, server
//	                           clock)
//	P:{T}:pk       string      the wait id last told of a free      5s after the telling
//	                           permit (see pass_permit in
//	                           lua/helpers.lua)
//	P:{T}:brk:<id> string      a Break's reply (what it removed),   BreakReceipt (1 min)
//	                           returned again to a retried Break
//	P:{T}:w:<id>   channel     (pub/sub, not a key) waiter <id>'s turn: a release publishes "1"
//
// The lock value is one of
//
//	value                           meaning                         written by         expires
//	<owner>|<token>|<metadata>      a lease                         acquire            PX the TTL
//	<owner>|0|<metadata>            a Redlock lease, not committed  quorum_grant       PX the TTL
//	<owner>|<token>|<metadata>      a Redlock lease whose proposed  quorum_grant       PX the TTL
//	                                token the grant recorded
//	|<token>                        a release marker: free          release,           PX FenceRetention
//	                                                                quorum_release
//	|<token>|<wait id>|<until ms>   a release marker reserving the  release,           PX FenceRetention
//	                                key for waiter <wait id>        quorum_release
//	|0|<wait id>|<until ms>         the same, after a release       quorum_release     PX HandoffReserve
//	                                without a token
//	*<mode>|<token>|<limit>         a group of shared (mode s,      acquire_group,     PEXPIREAT the
//	                                limit 0) or limited (mode l)    refresh_group,     latest holder's end
//	                                holders, in P:{T}:h and :hd;    release_group
//	                                token is the latest granted
//
// where
//
//	<owner>     32 lowercase hex digits, fresh for every attempt
//	<token>     decimal, at most 2^53; 0 only in the forms above (a grant
//	            over a token of 2^53 or more fails with DLOCKTOKEN)
//	<metadata>  JSON, an object of strings (host, pid and the caller's own)
//	<wait id>   redislock: 16 hex digits; Redlock: "<µs since epoch>-<8 hex digits>"
//	<until ms>  decimal, the end of the reservation on the server's clock
//
// Only <metadata> may contain '|', and it comes last (in P:{T}:hd too). The scripts and
// their files are named in the table as in lua/ (acquire is
// lua/acquire.lua); quorum_commit rewrites a Redlock lease with its
// token, keeping its expiry. FenceRetention is the retention the callers
// pass (redislock.FenceRetention, redlock.FenceRetention: an hour).
//
// The "{T}" hash tag keeps every key of a lock in one Cluster slot. A KEY
// starting with '}' would make an empty tag (Cluster then hashes the whole
// key, and the keys of one lock land in different slots), so such keys are
// written with a NUL byte in front ("P:{\x00}x}"); every other KEY is used
// as it is (see HashTag).
//
// Lease. Owner checks compare the "<owner>|" prefix of the value: owners
// are fresh for every attempt, so the prefix identifies one attempt
// exactly, and an attempt whose reply was lost can be undone knowing only
// the owner. redislock's acquire issues max(marker's token + 1, server's
// time in µs), the marker's token counting 0 when the key holds none
// (next_token in lua/helpers.lua): the time floor keeps tokens increasing
// through a restart or a failover that lost the marker, as long as the new
// server's clock is not behind the old one's by more than the
// interruption took. Redlock's grant writes
// token 0 and its commit the quorum token (the largest max(counter, server
// time in µs) of the granting majority, plus one).
//
// Release marker. A release replaces the lease with "|<token>": free for
// anyone, it carries the key's last token (redislock's next token is
// above it: max(marker + 1, server time in µs)). When the release woke a queued waiter, the marker also
// names it and the end of its reservation (HandoffReserve after the
// release): until then everyone else is refused, and reported the
// reservation (Outcome.ReservedFor, MetaReservedForWaiter) rather than a
// holder. A Redlock release without a token (an attempt that failed
// before its commit) deletes the key, or leaves "|0|<wait id>|<until ms>"
// when it woke a waiter.
//
// Waiters. A waiting Acquire's failed attempts add its wait id to
// P:{T}:waiters (ZADD NX, scored by its arrival in µs: Redlock's score is
// the one in its id, so every node orders its waiters alike) and push the
// set's expiry to a minute past the current lease or reservation. A
// release pops waiters in score order and PUBLISHes "1" on P:{T}:w:<id>:
// on a standalone server or Sentinel the first one that PUBLISH reports
// heard gets the reservation (departed ones are skipped, at most 16 per
// release); on a Cluster, where PUBLISH counts only the receivers on the
// node that ran it, the first one popped gets it. A waiter that leaves
// removes itself (ZREM, in the background, once no attempt of its own is
// in flight, retried with backoff for up to 30s when the link fails; see
// Waiters).
//
// Group. Shared and limited holders of a key (redislock only; Redlock
// is exclusive) are a group: the lock key holds "*<mode>|<token>|<limit>"
// and each holder is an entry of P:{T}:h, scored by the end of its lease
// on the server's clock (Redis TIME, ms), and of P:{T}:hd. A holder whose
// score is past is gone: the scripts remove such entries before they
// count. acquire_group grants while the holders are of the request's mode
// (and limit, for limited: another limit is refused as a mismatch) and
// fewer than the limit, the key holds a release marker without a
// reservation for someone else, or nothing; the token is the group's or
// the marker's + 1, never below the server's time in µs (next_token), so
// the key keeps one counter in every mode. refresh_group moves one holder's score;
// release_group removes one holder, records its token in P:{T}:rel at
// once (so that a retried release finds it), and, for the last holder,
// replaces the group with the marker "|<token>" (the group's latest) and
// wakes and reserves the key for the first queued waiter, as release
// does. The three keys expire (PEXPIREAT) with the group's latest holder.
// acquire sees a group as held (naming its holders in a fourth element
// of its reply), or as free once every holder's lease ended. An older
// client of version 2 reads a group value as a lease held by owner
// "*<mode>", so it refuses the key as it should.
//
// Waiting writers. acquire called with a waiter id (ARGV[6], the blocking
// Acquire's Request.Waiter) registers a refused attempt in P:{T}:wr,
// scored by the attempt's time plus its TTL, and removes the registration
// when it grants; leave removes it (and PUBLISHes to the first queued
// waiter, which may be a reader kept out). While P:{T}:wr holds a score
// in the future, acquire_group refuses shared requests (reply 3); a
// reader refused so while the marker reserves the key for it hands the
// reservation to the next queued waiter that has not handed one on, and
// queues again scored from HandedOn up, behind every such waiter: a
// hand-on reaches each queued waiter once, and readers queued behind a
// writer that died waiting do not hand it back and forth.
//
// Receipts. P:{T}:rel lists the tokens of the last Receipts release
// markers that an acquisition (acquire, quorum_grant) overwrote; it is
// trimmed back to Receipts entries once it holds more than twice as
// many. A release
// whose lease is gone reports success when its token is the current
// marker's or is in the receipts (or, in redislock, when the key holds a
// lease whose token is one more, which only the next lease taken from its
// marker gets, and only while the server clock is behind it): the release
// happened, and this is a retry whose first reply was lost.
//
// Fence. Redlock's commit raises P:{T}:fence to at least the quorum token
// and keeps it for the lease's TTL + FenceRetention; grants read it, so
// the next majority, which shares a node with the last, issues a larger
// token.
//
// Under the same prefix, redislock's Guard keeps keys of its own, outside
// this layout: "P:guard:{R}" holds "<token>|<owner>", the highest
// exclusive fence resource R accepted (no expiry), and "P:guard:{R}",
// a NUL byte and <name> the value kept under name (see redislock.Guard;
// R is encoded as HashTag encodes lock keys). List reads lock keys only.
//
// # Without scripts
//
// On a server with Tair's CAS and CAD (Alibaba Cloud Tair, or redis-server
// with the TairString module), tair.go implements exclusive locks with
// native commands only, for users whose ACL denies scripts: TairAcquire
// (SET NX PX, or CAS over a release marker, then the token by CAS),
// TairRefresh (CAS) and TairRelease (CAS to the marker "|<token>", and
// PUBLISH on the key's free channel "P:{T}:free"). They read and write
// the lock values, markers and receipts above, so a lease taken either
// way is read by the other; their comments give the token argument. A
// Lua-free release wakes no waiter of the scripts' queue (those find the
// key free at their next poll). redislock's Locker uses them when the
// server refuses its user's scripts (see redislock's Protocol).
//
// # Scripts
//
// Each script is a file in lua/, embedded, whose header comment gives its
// KEYS, ARGV and replies: acquire.lua, refresh.lua and release.lua for a
// single deployment (node.go), acquire_group.lua, refresh_group.lua,
// release_group.lua, leave.lua and holders.lua (List) for its shared and
// limited locks and waiting writers, quorum_grant.lua, quorum_commit.lua and
// quorum_release.lua for Redlock (quorum.go). The functions they share are
// in lua/helpers.lua. When a script is set up, the helpers it calls (and
// the helpers those call) are put in front of its first line, flattened to
// that one line: comments removed and lines joined, so the script keeps
// exactly the lines of its file and the line numbers Redis reports in an
// error ("user_script:12") are the file's. An error raised inside a helper
// is reported on line 1. The constants the Lua code names (RECEIPTS,
// RECEIPT_RETENTION_MS) are defined there too, from Receipts and
// ReceiptRetention.
//
// Every script is safe to execute twice, as go-redis does when a reply is
// lost on the way back: an acquisition that finds its own owner's lease is
// granted that lease again, a release that finds its marker or receipt
// reports success, refresh and commit are idempotent.
//
// # Replica acknowledgement
//
// A Node whose Acks is above 0 (redislock's WithReplicaAcks; never
// redlock) sends each acquire, acquire_group, refresh and refresh_group
// script in one pipeline with WAIT Acks AckTimeout after it (EvalAcked),
// so the WAIT runs on the connection that wrote and counts the replicas
// that have those writes; a batch renewal ends each server's pipeline with
// one WAIT. A grant or renewal that fewer replicas acknowledged is returned
// with an *AckError, and the caller decides (redislock rolls a grant back).
// The WAIT timeout is sent in whole milliseconds, rounded up and at least
// 1: WAIT n 0 would block forever. Releases, waiter bookkeeping and reads
// are not followed by WAIT. The scripts and the layout are unchanged.
//
// # Hung links
//
// Nothing a caller waits for blocks on a stalled link beyond what the
// caller allows: batch renewals report each server's results as they
// arrive, one pipeline per server (per master on a Cluster); the pub/sub
// hub never waits on the network when a subscription closes (its
// SUBSCRIBEs and UNSUBSCRIBEs are sent in order by a background worker);
// waiters are dequeued by a background worker per Node with a bounded
// backlog; Await lets a caller return by its context whatever the
// client's timeouts.
package redisproto

// ProtocolVersion is the version of the layout and value grammar in the
// package documentation. Version 1 was dlock's first layout: a fencing
// counter key for every lock and one release channel per key that woke
// every waiter. A change that makes keys written by one version misread
// by another gets a new version.
const ProtocolVersion = 2
