package redisx

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/background"
)

// Node is one Redis deployment (standalone, Sentinel or Cluster client)
// speaking dlock's lock protocol.
type Node struct {
	Client redis.UniversalClient
	Prefix string
	hub    *hub
	// cluster is "1" when Client is a Cluster client: PUBLISH then counts
	// only the receivers on the node that ran it, not those that the
	// cluster bus delivers to elsewhere (see wake_one in scripts.go).
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

// HashTag encodes a dlock key for the inside of the braces of a Redis key
// ("P:{<tag>}..."), where it must form a non-empty Cluster hash tag so that
// every Redis key of one lock lands in one slot. Cluster hashes the part
// between the first '{' and the first '}' after it, and hashes the whole
// key when that part is empty: a key starting with '}' would have an empty
// tag. Such keys get a NUL byte in front ("\x00}x"), which makes the tag
// "\x00"; every other key is used as it is (the layout of earlier
// versions). dlock keys never contain NUL, so the encoding is injective
// and DecodeHashTag undoes it.
func HashTag(key string) string {
	if strings.HasPrefix(key, "}") {
		return "\x00" + key
	}
	return key
}

// DecodeHashTag is the inverse of HashTag.
func DecodeHashTag(tag string) string { return strings.TrimPrefix(tag, "\x00") }

// LockKey is the key holding key's lease.
func (n *Node) LockKey(key string) string { return n.Prefix + ":{" + HashTag(key) + "}" }

// FenceKey is the key holding key's quorum fencing counter (Redlock).
func (n *Node) FenceKey(key string) string { return n.LockKey(key) + fenceSuffix }

// WaitersKey is the queue of waiters to wake, one per release.
func (n *Node) WaitersKey(key string) string { return n.LockKey(key) + waitersSuffix }

// ReceiptsKey is the list of the tokens of key's last released leases
// whose markers a later acquisition took over (see Receipts).
func (n *Node) ReceiptsKey(key string) string { return n.LockKey(key) + receiptsSuffix }

// The suffixes of a lock's other keys and of its waiters' channels, after
// the lock key (see the package documentation). The scripts' callers
// build all of them from one LockKey.
const (
	fenceSuffix    = ":fence"
	waitersSuffix  = ":waiters"
	receiptsSuffix = ":rel"
	channelSuffix  = ":w:"
)

// Release receipts. A release leaves the marker "|<token>" in the lock
// key; an acquisition that later overwrites the marker records its token
// in the key's receipt list, which keeps the last Receipts tokens and
// expires ReceiptRetention after the latest. A release retried after its
// first attempt took effect (the reply was lost) finds its token in the
// marker or the receipts and reports success, however often the key
// changed hands meanwhile, within those limits: a retry after more than
// Receipts further hand-overs, or more than ReceiptRetention after the
// latest one, is reported as a lease no longer held. Recording at the
// hand-over rather than at the release keeps the uncontended cycle free of
// an extra key: a release whose key nobody takes over writes nothing but
// its marker. A hand-over costs an LPUSH and a PEXPIRE (and, every
// Receipts hand-overs, an LTRIM) in the acquisition's script.
const (
	Receipts         = 8
	ReceiptRetention = time.Minute
)

// WaiterChannel is the channel waiter id listens on for its turn.
func (n *Node) WaiterChannel(key, id string) string { return n.waiterPrefix(key) + id }

func (n *Node) waiterPrefix(key string) string { return n.LockKey(key) + channelSuffix }

// Ms converts a duration to whole milliseconds for PX arguments.
func Ms(d time.Duration) int64 { return d.Milliseconds() }

// Outcome is the result of an acquisition attempt on one node.
type Outcome struct {
	Granted bool
	// Token is the token assigned (Acquire) or the node's counter floor,
	// max(counter, server time in µs) (Grant).
	Token uint64
	// Holder and PTTL describe the current holder when not granted. When
	// the key is free but reserved for the waiter the last release woke,
	// Holder has no owner, its Metadata says MetaReservedForWaiter, and
	// PTTL is the reservation left.
	Holder Info
	PTTL   time.Duration
	// ReservedFor is the wait id of the waiter the key is reserved for.
	ReservedFor string
}

// MetaReservedForWaiter is the metadata key naming the waiter a free key
// is reserved for (see HandoffReserve), reported in place of a holder.
const MetaReservedForWaiter = "reserved_for_waiter"

// reservedFor returns the wait id of a reservation marker
// ("|<token>|<wait id>|<until ms>").
func reservedFor(v string) (string, bool) {
	if !strings.HasPrefix(v, "|") {
		return "", false
	}
	parts := strings.Split(v[1:], "|")
	if len(parts) != 3 || parts[1] == "" {
		return "", false
	}
	return parts[1], true
}

func parseOutcome(res []any, err error) (Outcome, error) {
	if err != nil {
		return Outcome{}, err
	}
	if len(res) >= 2 && res[0] == int64(1) {
		tok, err := strconv.ParseUint(fmt.Sprint(res[1]), 10, 64)
		if err != nil {
			return Outcome{}, fmt.Errorf("bad token %v", res[1])
		}
		return Outcome{Granted: true, Token: tok}, nil
	}
	var o Outcome
	if len(res) >= 3 {
		v := fmt.Sprint(res[1])
		if id, ok := reservedFor(v); ok {
			o.ReservedFor = id
			o.Holder = Info{Metadata: map[string]string{MetaReservedForWaiter: id}}
		} else {
			o.Holder = ParseValue(v)
		}
		if pttl, ok := res[2].(int64); ok && pttl > 0 {
			o.PTTL = time.Duration(pttl) * time.Millisecond
		}
	}
	return o, nil
}

// Acquire is the single-deployment acquisition: SET PX plus the token, in
// one script. A non-empty waitID queues the caller to be woken by the next
// release when the key is held.
func (n *Node) Acquire(ctx context.Context, key, owner string, ttl time.Duration, meta, waitID string) (Outcome, error) {
	lk := n.LockKey(key)
	return parseOutcome(acquireScript.Run(ctx, n.Client, []string{lk, lk + waitersSuffix, lk + receiptsSuffix},
		owner, Ms(ttl), meta, waitID, time.Now().UnixMicro()).Slice())
}

// Grant is phase one of a quorum acquisition: SET NX PX with token 0 in the
// value; it returns the node's counter floor.
func (n *Node) Grant(ctx context.Context, key, owner string, ttl time.Duration, meta, waitID string, score int64) (Outcome, error) {
	lk := n.LockKey(key)
	return parseOutcome(grantScript.Run(ctx, n.Client, []string{lk, lk + fenceSuffix, lk + waitersSuffix, lk + receiptsSuffix},
		owner, Ms(ttl), meta, waitID, score).Slice())
}

// Commit is phase two: if owner still holds key here, record token in the
// value and raise the counter to at least token.
func (n *Node) Commit(ctx context.Context, key, owner string, token uint64, meta string, retention time.Duration) (bool, error) {
	v, err := commitScript.Run(ctx, n.Client, []string{n.LockKey(key), n.FenceKey(key)},
		owner+"|", strconv.FormatUint(token, 10), FormatValue(owner, token, meta), Ms(retention)).Int64()
	return v == 1, err
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

// QuorumRelease is Redlock's per-node release: compare-and-release, or
// hand the key to the first queued waiter; false means owner does not
// hold key. With the lease's quorum token (0 when unknown) the key keeps
// the marker "|<token>" for retention, so that a retried release reports
// true (see Receipts); without it the key is deleted.
func (n *Node) QuorumRelease(ctx context.Context, key, owner string, token uint64, retention time.Duration) (bool, error) {
	lk := n.LockKey(key)
	v, err := quorumReleaseScript.Run(ctx, n.Client, []string{lk, lk + waitersSuffix, lk + receiptsSuffix},
		owner+"|", lk+channelSuffix, Ms(HandoffReserve), tokenArg(token), Ms(retention), n.cluster).Int64()
	return v == 1, err
}

func tokenArg(token uint64) string {
	if token == 0 {
		return ""
	}
	return strconv.FormatUint(token, 10)
}

// Renewal is one lease to extend in RefreshBatch.
type Renewal struct {
	Key, Owner string
	TTL        time.Duration
}

// RefreshBatch extends many leases with compare-and-pexpire scripts, one
// pipeline per server, and calls report(i, held, err) once for each
// renewal as soon as its server answered (held is false when owner no
// longer holds the key). On a Cluster the renewals are grouped by the
// master owning their slot and each group is a pipeline of its own sent
// through the ClusterClient (which follows MOVED and ASK), the groups
// concurrently: go-redis's own Cluster pipeline waits for every node, so
// one hung master would hold up the renewals of all the others. report is
// called from the goroutine of the group's pipeline. RefreshBatch returns
// when every group has been reported, which takes as long as the client's
// own timeouts allow: a caller that must not wait runs it on a goroutine
// of its own.
func (n *Node) RefreshBatch(ctx context.Context, rs []Renewal, report func(i int, held bool, err error)) {
	groups := n.groupByServer(ctx, rs)
	if len(groups) == 1 {
		n.refreshGroup(ctx, rs, groups[0], report)
		return
	}
	var wg sync.WaitGroup
	for _, g := range groups {
		wg.Add(1)
		background.Go(func() {
			defer wg.Done()
			n.refreshGroup(ctx, rs, g, report)
		})
	}
	wg.Wait()
}

// groupByServer splits the indexes of rs by the Cluster master owning each
// key's slot; one group on any other client.
func (n *Node) groupByServer(ctx context.Context, rs []Renewal) [][]int {
	cc, ok := n.Client.(*redis.ClusterClient)
	if !ok || len(rs) < 2 {
		all := make([]int, len(rs))
		for i := range all {
			all[i] = i
		}
		return [][]int{all}
	}
	var groups [][]int
	index := map[*redis.Client]int{}
	for i, r := range rs {
		// From the cached slot map: no I/O once the client knows the
		// cluster (it does: it took these leases). A key whose master is
		// unknown gets the nil group; its pipeline reports the error.
		m, _ := cc.MasterForKey(ctx, n.LockKey(r.Key))
		g, ok := index[m]
		if !ok {
			g = len(groups)
			index[m] = g
			groups = append(groups, nil)
		}
		groups[g] = append(groups[g], i)
	}
	return groups
}

// refreshGroup renews rs[idx] in one pipeline and reports each.
func (n *Node) refreshGroup(ctx context.Context, rs []Renewal, idx []int, report func(i int, held bool, err error)) {
	cmds := make([]*redis.Cmd, len(idx))
	_, _ = n.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for k, i := range idx {
			cmds[k] = refreshScript.EvalSha(ctx, p, []string{n.LockKey(rs[i].Key)}, rs[i].Owner+"|", Ms(rs[i].TTL))
		}
		return nil
	})
	var missing []int // positions in idx whose script the server lacked
	for k, c := range cmds {
		v, err := c.Int64()
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			missing = append(missing, k)
			continue
		}
		report(idx[k], v == 1, err)
	}
	if len(missing) == 0 {
		return
	}
	// The server lost its script cache (first use, restart, failover,
	// SCRIPT FLUSH): resend those renewals as EVAL, which carries the
	// script and caches it again, in one pipeline. (One request per lock
	// here cost a round trip each: a batch of hundreds outlived its
	// deadlines on a healthy server.)
	cmds = cmds[:0]
	_, _ = n.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range missing {
			i := idx[k]
			cmds = append(cmds, refreshScript.Eval(ctx, p, []string{n.LockKey(rs[i].Key)}, rs[i].Owner+"|", Ms(rs[i].TTL)))
		}
		return nil
	})
	for j, c := range cmds {
		v, err := c.Int64()
		report(idx[missing[j]], v == 1, err)
	}
}

// Watch subscribes waiter id to its turn on key: the channel a release
// publishes on when it picks id from the waiter queue.
func (n *Node) Watch(ctx context.Context, key, id string) (*Subscription, error) {
	return n.hub.watch(ctx, n.WaiterChannel(key, id), make(chan struct{}, 1))
}

// WatchInto is Watch delivering into ch (buffered, sent without
// blocking), so one waiter can listen on several nodes without a goroutine
// each.
func (n *Node) WatchInto(ctx context.Context, key, id string, ch chan struct{}) (*Subscription, error) {
	return n.hub.watch(ctx, n.WaiterChannel(key, id), ch)
}

// Info describes a held lock as stored in Redis.
type Info struct {
	Key      string            `json:"key"`
	Owner    string            `json:"owner"`
	Token    uint64            `json:"token"`
	TTL      time.Duration     `json:"ttl"`
	Metadata map[string]string `json:"metadata,omitempty"`
}

// FormatValue builds a lease value.
func FormatValue(owner string, token uint64, meta string) string {
	return owner + "|" + strconv.FormatUint(token, 10) + "|" + meta
}

// EncodeMetadata encodes metadata for FormatValue and the scripts.
func EncodeMetadata(md map[string]string) (string, error) {
	b, err := json.Marshal(md)
	return string(b), err
}

// ParseValue splits a lease value "<owner>|<token>|<metadata json>".
func ParseValue(v string) Info {
	var in Info
	parts := strings.SplitN(v, "|", 3)
	in.Owner = parts[0]
	if len(parts) > 1 {
		in.Token, _ = strconv.ParseUint(parts[1], 10, 64)
	}
	if len(parts) > 2 {
		_ = json.Unmarshal([]byte(parts[2]), &in.Metadata)
	}
	return in
}

// List returns the leases whose key starts with prefix, by SCAN (on every
// master of a Cluster). For operators, not hot paths.
func (n *Node) List(ctx context.Context, prefix string) ([]Info, error) {
	tag := ""
	if prefix != "" {
		tag = HashTag(prefix)
	}
	pattern := n.Prefix + ":{" + globEscape(tag) + "*"
	var (
		mu  sync.Mutex
		out []Info
	)
	scan := func(ctx context.Context, c redis.Cmdable) error {
		it := c.Scan(ctx, 0, pattern, 512).Iterator()
		var keys []string
		for it.Next(ctx) {
			k := it.Val()
			if !strings.HasSuffix(k, "}") { // :fence, :waiters, :rel
				continue
			}
			// The pattern matches on the Redis key, not on the dlock key:
			// with a '}' in prefix, "P:{a}*" also matches the lock of "a"
			// ("P:{a}"). Only keys that start with prefix are listed.
			if !strings.HasPrefix(n.decodeLockKey(k), prefix) {
				continue
			}
			keys = append(keys, k)
		}
		if err := it.Err(); err != nil {
			return err
		}
		for _, k := range keys {
			v, err := c.Get(ctx, k).Result()
			if errors.Is(err, redis.Nil) {
				continue
			}
			if err != nil {
				return err
			}
			if strings.HasPrefix(v, "|") {
				continue // a release marker: not held
			}
			ttl, err := c.PTTL(ctx, k).Result()
			if err != nil {
				return err
			}
			in := ParseValue(v)
			in.Key = n.decodeLockKey(k)
			in.TTL = ttl
			mu.Lock()
			out = append(out, in)
			mu.Unlock()
		}
		return nil
	}
	var err error
	if cc, ok := n.Client.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return scan(ctx, c) })
	} else {
		err = scan(ctx, n.Client)
	}
	return out, err
}

// decodeLockKey is the dlock key of lock key k (the inverse of LockKey).
func (n *Node) decodeLockKey(k string) string {
	return DecodeHashTag(strings.TrimSuffix(strings.TrimPrefix(k, n.Prefix+":{"), "}"))
}

func globEscape(s string) string {
	var sb strings.Builder
	for _, r := range s {
		switch r {
		case '*', '?', '[', ']', '\\':
			sb.WriteByte('\\')
		}
		sb.WriteRune(r)
	}
	return sb.String()
}
