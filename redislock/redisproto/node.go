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
	// cluster is "1" when Client is a Cluster client: PUBLISH then counts
	// only the receivers on the node that ran it, not those that the
	// cluster bus delivers to elsewhere (see wake_one in lua/helpers.lua).
	cluster string
	dq      dequeuer
}

// NewNode returns a Node on c with key prefix prefix.
func NewNode(c redis.UniversalClient, prefix string) *Node {
	n := &Node{Client: c, Prefix: prefix, hub: newHub(c), cluster: "0"}
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
	acquireScript = script("acquire") // lua/acquire.lua
	refreshScript = script("refresh") // lua/refresh.lua
	releaseScript = script("release") // lua/release.lua
)

// Acquire is the single-deployment acquisition: SET PX plus the token, in
// one script. A non-empty waitID queues the caller to be woken by the next
// release when the key is held.
func (n *Node) Acquire(ctx context.Context, key, owner string, ttl time.Duration, meta, waitID string) (Outcome, error) {
	lk := n.LockKey(key)
	return parseOutcome(acquireScript.Run(ctx, n.Client, []string{lk, lk + waitersSuffix, lk + receiptsSuffix},
		owner, Ms(ttl), meta, waitID, time.Now().UnixMicro()).Slice())
}

// Refresh is compare-and-PEXPIRE; false means owner does not hold key here.
func (n *Node) Refresh(ctx context.Context, key, owner string, ttl time.Duration) (bool, error) {
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
	v, err := releaseScript.Run(ctx, n.Client, []string{lk, lk + waitersSuffix, lk + receiptsSuffix},
		owner+"|", Ms(retention), lk+channelSuffix, Ms(HandoffReserve), tokenArg(token), n.cluster).Int64()
	return v == 1, err
}

func tokenArg(token uint64) string {
	if token == 0 {
		return ""
	}
	return strconv.FormatUint(token, 10)
}
