package redisproto

import (
	"context"
	"fmt"
	"strconv"
	"time"
)

// The quorum (Redlock) scripts, run on each node (see the header of each
// file in lua/ for its KEYS, ARGV and replies).
var (
	grantScript         = script("quorum_grant")   // lua/quorum_grant.lua
	commitScript        = script("quorum_commit")  // lua/quorum_commit.lua
	quorumReleaseScript = script("quorum_release") // lua/quorum_release.lua
)

// MaxProposalLead is the default Proposal.MaxLead.
const MaxProposalLead = time.Second

// Proposal is the token a quorum grant proposes to record.
type Proposal struct {
	// Token is the proposed token; 0 proposes none.
	Token uint64
	// Retention is how long the raised counter is kept.
	Retention time.Duration
	// MaxLead is the most the token may be ahead of the node's clock for
	// the node to record it (0: MaxProposalLead): a client whose
	// proposals run further ahead (a wrong measure) commits instead.
	MaxLead time.Duration
}

// Grant is phase one of a quorum acquisition: SET NX PX; it returns the
// node's counter floor from before the grant and the node's time. A
// proposed token above that floor, and at most p.MaxLead ahead of the
// node's time, is recorded as the token in the value and in the counter
// (kept for p.Retention), and the Outcome says Recorded; otherwise the
// value holds token 0 until a Commit.
func (n *Node) Grant(ctx context.Context, key, owner string, ttl time.Duration, meta, waitID string, score int64, p Proposal) (Outcome, error) {
	lk := n.LockKey(key)
	lead := p.MaxLead
	if lead <= 0 {
		lead = MaxProposalLead
	}
	return parseOutcome(grantScript.Run(ctx, n.Client, []string{lk, lk + fenceSuffix, lk + waitersSuffix, lk + receiptsSuffix},
		owner, Ms(ttl), meta, waitID, score, strconv.FormatUint(p.Token, 10), Ms(p.Retention), lead.Microseconds()).Slice())
}

// Commit is phase two: if owner still holds key here, record token in the
// value and raise the counter to at least token.
func (n *Node) Commit(ctx context.Context, key, owner string, token uint64, meta string, retention time.Duration) (bool, error) {
	v, err := commitScript.Run(ctx, n.Client, []string{n.LockKey(key), n.FenceKey(key)},
		owner+"|", strconv.FormatUint(token, 10), FormatValue(owner, token, meta), Ms(retention)).Int64()
	return v == 1, err
}

// QuorumRelease is Redlock's per-node release: compare-and-release, or
// hand the key to the first queued waiter; false means owner does not
// hold key. With the lease's quorum token (0 when unknown) the key keeps
// the marker "|<token>" for retention, so that a retried release reports
// true (see Receipts); without it the key is deleted. at is the node's
// time when it ran the release, µs (0 if the reply lacks it).
func (n *Node) QuorumRelease(ctx context.Context, key, owner string, token uint64, retention time.Duration) (ok bool, at int64, err error) {
	lk := n.LockKey(key)
	res, err := quorumReleaseScript.Run(ctx, n.Client, []string{lk, lk + waitersSuffix, lk + receiptsSuffix},
		owner+"|", lk+channelSuffix, Ms(HandoffReserve), tokenArg(token), Ms(retention), n.cluster).Slice()
	if err != nil {
		return false, 0, err
	}
	if len(res) < 2 {
		return false, 0, fmt.Errorf("quorum_release: unexpected reply %v", res)
	}
	if s, isStr := res[1].(string); isStr {
		at, _ = strconv.ParseInt(s, 10, 64)
	}
	return res[0] == int64(1), at, nil
}
