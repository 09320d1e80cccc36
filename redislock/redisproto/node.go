package redisproto

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Node is one Redis deployment (standalone, Sentinel or Cluster client)
// speaking dlock's lock protocol.
type Node struct {
	Client redis.UniversalClient
	Prefix string
	hub    *hub
	breaks *hub // holders' break notices (WatchBreaks)
	// cluster is "1" when Client is a Cluster client: PUBLISH then counts
	// only the receivers on the node that ran it, not those that the
	// cluster bus delivers to elsewhere (see wake_one in lua/helpers.lua).
	cluster string
	dq      dequeuer
	ev      evictionCheck
	// Acks, when above 0, makes Acquire, AcquireGroup, Refresh,
	// RefreshGroup and RefreshBatch wait for that many replicas to
	// acknowledge their writes (WAIT Acks AckTimeout on the connection
	// that wrote them; see EvalAcked). A grant or renewal acknowledged by
	// fewer is returned with an *AckError. Set it before first use, on a
	// standalone or Sentinel client only (WAIT counts the replicas of one
	// primary); AckTimeout must be above 0. 0 (the default) runs the
	// scripts alone.
	Acks       int
	AckTimeout time.Duration
}

// NewNode returns a Node on c with key prefix prefix.
func NewNode(c redis.UniversalClient, prefix string) *Node {
	n := &Node{Client: c, Prefix: prefix, hub: newHub(c), breaks: newHub(c), cluster: "0"}
	n.breaks.lasting = true
	if _, ok := c.(*redis.ClusterClient); ok {
		n.cluster = "1"
	}
	return n
}

// IsNil reports whether c is nil, including typed nil pointers.
func IsNil(c redis.UniversalClient) bool {
	switch v := c.(type) {
	case nil:
		return true
	case *redis.Client:
		return v == nil
	case *redis.ClusterClient:
		return v == nil
	case *redis.Ring:
		return v == nil
	}
	return false
}

// Ms converts a duration to whole milliseconds for PX arguments.
func Ms(d time.Duration) int64 { return d.Milliseconds() }

// The single-node scripts, run by redislock and, for renewals, by redlock
// (see the header of each file in lua/ for its KEYS, ARGV and replies).
var (
	acquireScript     = script("acquire")      // lua/acquire.lua
	acquireFastScript = script("acquire_fast") // lua/acquire_fast.lua
	refreshScript     = script("refresh")      // lua/refresh.lua
	releaseScript     = script("release")      // lua/release.lua
	releaseFastScript = script("release_fast") // lua/release_fast.lua

	acquireGroupScript = script("acquire_group") // lua/acquire_group.lua
	refreshGroupScript = script("refresh_group") // lua/refresh_group.lua
	releaseGroupScript = script("release_group") // lua/release_group.lua
	leaveScript        = script("leave")         // lua/leave.lua
	holdersScript      = script("holders")       // lua/holders.lua
)

// Acquire is the single-deployment exclusive acquisition: SET PX plus the
// token, in one script. A non-empty waitID queues the caller to be woken
// by the next release when the key is held; a non-empty waiter (a blocking
// Acquire's Request.Waiter) registers a refused attempt as a waiting
// writer, which keeps new shared holders out for ttl (writer preference).
func (n *Node) Acquire(ctx context.Context, key, owner string, ttl time.Duration, meta, waitID, waiter string) (Outcome, error) {
	lk := n.LockKey(key)
	if n.Acks > 0 {
		return n.acquireAcked(ctx, acquireScript, n.groupKeys(lk),
			owner, Ms(ttl), meta, waitID, time.Now().UnixMicro(), waiter, lk+channelSuffix, n.cluster)
	}
	return parseOutcome(acquireScript.Run(ctx, n.Client, n.groupKeys(lk),
		owner, Ms(ttl), meta, waitID, time.Now().UnixMicro(), waiter, lk+channelSuffix, n.cluster).Slice())
}

// AcquireFast is Acquire for the first attempt of an exclusive
// acquisition that is not queued, on a Node without Acks: one smaller
// script for a free key, and, when tryOnly (no waiter to register: a
// TryAcquire), for a key another owner holds. ok false means the key is
// in a state only acquire.lua answers for (reserved, a group's, owner's
// own lease, or held when a refusal registers a waiter): run Acquire.
func (n *Node) AcquireFast(ctx context.Context, key, owner string, ttl time.Duration, meta string, tryOnly bool) (o Outcome, ok bool, err error) {
	lk := n.LockKey(key)
	flag := "0"
	if tryOnly {
		flag = "1"
	}
	res, err := acquireFastScript.Run(ctx, n.Client, withSuffixes(lk, receiptsSuffix), owner, Ms(ttl), meta, flag).Slice()
	if err != nil {
		return Outcome{}, false, err
	}
	if len(res) == 1 {
		return Outcome{}, false, nil
	}
	o, err = parseOutcome(res, nil)
	return o, err == nil, err
}

// groupKeys are the keys of acquire.lua and acquire_group.lua.
func (n *Node) groupKeys(lk string) []string {
	return withSuffixes(lk, waitersSuffix, receiptsSuffix, holdersSuffix, holderDataSuffix, writersSuffix, permitSuffix)
}

// AcquireGroup is a shared (limit 0) or limited (limit >= 1) acquisition:
// one holder more in the key's group, with a lease of its own. waitID
// queues the caller as in Acquire.
func (n *Node) AcquireGroup(ctx context.Context, key, owner string, ttl time.Duration, meta, waitID string, limit int) (Outcome, error) {
	lk := n.LockKey(key)
	mode := "s"
	if limit > 0 {
		mode = "l"
	}
	if n.Acks > 0 {
		return n.acquireAcked(ctx, acquireGroupScript, n.groupKeys(lk),
			owner, Ms(ttl), meta, waitID, time.Now().UnixMicro(), mode, limit, lk+channelSuffix, Ms(HandoffReserve), n.cluster)
	}
	return parseOutcome(acquireGroupScript.Run(ctx, n.Client, n.groupKeys(lk),
		owner, Ms(ttl), meta, waitID, time.Now().UnixMicro(), mode, limit, lk+channelSuffix, Ms(HandoffReserve), n.cluster).Slice())
}

// RefreshGroup extends a shared or limited holder's lease; false means
// owner is no longer a holder of key.
func (n *Node) RefreshGroup(ctx context.Context, key, owner string, ttl time.Duration) (bool, error) {
	lk := n.LockKey(key)
	if n.Acks > 0 {
		return n.refreshAcked(ctx, refreshGroupScript, []string{lk, lk + holdersSuffix, lk + holderDataSuffix}, owner, Ms(ttl))
	}
	v, err := refreshGroupScript.Run(ctx, n.Client, []string{lk, lk + holdersSuffix, lk + holderDataSuffix}, owner, Ms(ttl)).Int64()
	return v == 1, err
}

// ReleaseGroup removes a shared or limited holder; false means owner is
// not a holder of key. token (0 when unknown) lets a retry whose first
// attempt took effect report true.
func (n *Node) ReleaseGroup(ctx context.Context, key, owner string, token uint64, retention time.Duration) (bool, error) {
	lk := n.LockKey(key)
	v, err := releaseGroupScript.Run(ctx, n.Client,
		[]string{lk, lk + waitersSuffix, lk + receiptsSuffix, lk + holdersSuffix, lk + holderDataSuffix, lk + permitSuffix},
		owner, Ms(retention), lk+channelSuffix, Ms(HandoffReserve), tokenArg(token), n.cluster).Int64()
	return v == 1, err
}

// Leave withdraws waiting writer waiter's registration on key (harmless
// for an unknown one); readers kept out for it are poked.
func (n *Node) Leave(ctx context.Context, key, waiter string) error {
	lk := n.LockKey(key)
	return leaveScript.Run(ctx, n.Client, []string{lk + waitersSuffix, lk + writersSuffix}, waiter, lk+channelSuffix).Err()
}

// Refresh is compare-and-PEXPIRE; false means owner does not hold key here.
func (n *Node) Refresh(ctx context.Context, key, owner string, ttl time.Duration) (bool, error) {
	if n.Acks > 0 {
		return n.refreshAcked(ctx, refreshScript, []string{n.LockKey(key)}, owner+"|", Ms(ttl))
	}
	v, err := refreshScript.Run(ctx, n.Client, []string{n.LockKey(key)}, owner+"|", Ms(ttl)).Int64()
	return v == 1, err
}

// HandoffReserve is how long a release keeps the key for the waiter it
// woke: long enough for the waiter to ask, short enough that a waiter that
// died in between delays the next one only briefly.
const HandoffReserve = 100 * time.Millisecond

// Release replaces owner's lease with the token marker (kept for
// retention) and wakes one waiter, reserving the key for it; false means
// owner does not hold key. token is the lease's token (0 when unknown):
// with it, a release that already took effect (a retry) reports true (see
// Receipts).
func (n *Node) Release(ctx context.Context, key, owner string, token uint64, retention time.Duration) (bool, error) {
	lk := n.LockKey(key)
	v, err := releaseScript.Run(ctx, n.Client, withSuffixes(lk, waitersSuffix, receiptsSuffix),
		owner+"|", Ms(retention), lk+channelSuffix, Ms(HandoffReserve), tokenArg(token), n.cluster).Int64()
	return v == 1, err
}

// ReleaseFast is Release for a lease acquired uncontended: one smaller
// script when no waiter is queued. ok false means the key is in a state
// only release.lua answers for (waiters queued, or not owner's lease):
// run Release.
func (n *Node) ReleaseFast(ctx context.Context, key, owner string, retention time.Duration) (ok bool, err error) {
	lk := n.LockKey(key)
	v, err := releaseFastScript.Run(ctx, n.Client, withSuffixes(lk, waitersSuffix), owner+"|", Ms(retention)).Int64()
	return err == nil && v == 1, err
}

func tokenArg(token uint64) string {
	if token == 0 {
		return ""
	}
	return strconv.FormatUint(token, 10)
}
