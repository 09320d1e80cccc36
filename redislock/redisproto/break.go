package redisproto

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

var breakScript = script("break") // lua/break.lua

// Break removes key's leases in one script (lua/break.lua): every holder's
// when owner is "", else owner's alone. It returns the leases removed and,
// when owner holds nothing, the holders left in place. A lease or a
// group's last holder is replaced with a release marker (kept for
// retention) whose token is above the broken ones, and one waiter is
// woken; the broken holders' later Refresh and Release find nothing of
// theirs. A break that removed something publishes on BreakChannel(key)
// (see WatchBreaks).
func (n *Node) Break(ctx context.Context, key, owner string, retention time.Duration) (removed, others []Info, err error) {
	return n.breakLock(ctx, key, owner, retention, "0")
}

// QuorumBreak is Break on a Redlock node: the lease is replaced with a
// marker without a token (the quorum counter, in its own key, is left
// alone), as QuorumRelease without a token does.
func (n *Node) QuorumBreak(ctx context.Context, key, owner string) (removed, others []Info, err error) {
	return n.breakLock(ctx, key, owner, HandoffReserve, "1")
}

// BreakReceipt is how long a break that removed something keeps its
// reply on the server, for the same call's retry (go-redis retries a
// command whose connection failed, and the reply may be what was lost):
// the retry returns what the break removed, not "free".
const BreakReceipt = time.Minute

// breakSuffix names a break's receipt: lock key + breakSuffix + break id.
const breakSuffix = ":brk:"

func (n *Node) breakLock(ctx context.Context, key, owner string, retention time.Duration, quorum string) (removed, others []Info, err error) {
	lk := n.LockKey(key)
	var id [16]byte
	if _, err := rand.Read(id[:]); err != nil {
		return nil, nil, err
	}
	brk := hex.EncodeToString(id[:])
	res, err := breakScript.Run(ctx, n.Client,
		[]string{lk, lk + waitersSuffix, lk + holdersSuffix, lk + holderDataSuffix, lk + permitSuffix, lk + breakSuffix + brk},
		owner, Ms(retention), lk+channelSuffix, Ms(HandoffReserve), n.cluster, quorum, brk, Ms(BreakReceipt), lk+breakChanSuffix).Slice()
	if err != nil {
		return nil, nil, err
	}
	if len(res) != 3 {
		return nil, nil, fmt.Errorf("redisproto: break.lua replied %d values, want 3", len(res))
	}
	mode, _, _, _ := ParseGroup(fmt.Sprint(res[0]))
	removed, others = parseHolders(res[1], mode), parseHolders(res[2], mode)
	for i := range removed {
		removed[i].Key = key
	}
	for i := range others {
		others[i].Key = key
	}
	return removed, others, nil
}

// WatchBreaks delivers into ch (buffered, sent without blocking) each
// notice that a break removed leases of key, and a spurious one when the
// pub/sub connection was lost (a notice may have been missed): the
// receiver checks its lease (Holds) on each. It waits for the SUBSCRIBE
// as Watch does. The notices come on a pub/sub connection of their own,
// open while anyone listens, apart from the waiters' (Watch); its reader
// ends when the client is closed.
func (n *Node) WatchBreaks(ctx context.Context, key string, ch chan struct{}) (*Subscription, error) {
	return n.breaks.watch(ctx, n.BreakChannel(key), ch)
}

// ListenAllBreaks listens for the break notices of every key of the
// Node's prefix with one pattern subscription (PSUBSCRIBE), without
// waiting: notice is called (on the hub's reader goroutine, which it must
// not block, nor call into the Node's subscriptions) with the dlock key
// of each break, and with "" once Redis confirms the PSUBSCRIBE (a break
// before it was not heard) and when the pub/sub connection was lost. A
// Locker holding many locks listens once, not once per lock. It returns
// at once, even on a stalled link.
func (n *Node) ListenAllBreaks(notice func(key string)) *Subscription {
	pattern := globEscape(n.Prefix) + ":{*}" + breakChanSuffix
	head, tail := n.Prefix+":{", "}"+breakChanSuffix
	return n.breaks.listenPattern(pattern, func(channel string) {
		if channel == "" {
			notice("")
			return
		}
		tag, ok := strings.CutPrefix(channel, head)
		if tag, ok = strings.CutSuffix(tag, tail); ok && tag != "" {
			notice(DecodeHashTag(tag))
		}
	})
}

// HoldsQuery is one question of HoldsAll: does Owner still hold Key
// (Group: as a shared or limited holder)?
type HoldsQuery struct {
	Key, Owner string
	Group      bool
	// Value, when set, is the exclusive lease's whole value, read with
	// GET (the Lua-free protocol) instead of the script.
	Value string
}

// heldScript answers HoldsAll's questions on the primary.
var heldScript = script("held") // lua/held.lua

// HoldsAll is Holds for each query, asked of the primary (a script: see
// lua/held.lua), in one pipeline (on a Cluster, one per master): held[i]
// answers qs[i] when errs[i] is nil; a query whose command failed (its
// master down, say) has its error, and the others their answers. A
// server that lacks the script gets those queries again as EVAL, in one
// more pipeline. A query with a Value is a GET compared with it (the
// Lua-free protocol), which a client that routes reads to replicas may
// send to one.
func (n *Node) HoldsAll(ctx context.Context, qs []HoldsQuery) (held []bool, errs []error) {
	held, errs = make([]bool, len(qs)), make([]error, len(qs))
	run := func(idx []int, eval bool) (missing []int) {
		cmds := make([]*redis.Cmd, len(idx))
		_, _ = n.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
			for k, i := range idx {
				q := qs[i]
				lk, group := n.LockKey(q.Key), "0"
				if q.Group {
					group = "1"
				}
				keys := withSuffixes(lk, holdersSuffix)
				switch {
				case q.Value != "":
					cmds[k] = p.Do(ctx, "GET", lk)
				case eval:
					cmds[k] = heldScript.Eval(ctx, p, keys, q.Owner, group)
				default:
					cmds[k] = heldScript.EvalSha(ctx, p, keys, q.Owner, group)
				}
			}
			return nil
		})
		for k, c := range cmds {
			if v := qs[idx[k]].Value; v != "" {
				got, err := c.Text()
				switch {
				case errors.Is(err, redis.Nil):
				case err != nil:
					errs[idx[k]] = err
				default:
					held[idx[k]] = got == v
				}
				continue
			}
			v, err := c.Int64()
			switch {
			case err != nil && !eval && redis.HasErrorPrefix(err, "NOSCRIPT"):
				missing = append(missing, idx[k])
			case err != nil:
				errs[idx[k]] = err
			default:
				held[idx[k]] = v == 1
			}
		}
		return missing
	}
	all := make([]int, len(qs))
	for i := range all {
		all[i] = i
	}
	if missing := run(all, false); len(missing) > 0 {
		run(missing, true)
	}
	return held, errs
}

// Holds reports whether owner still holds key: the exclusive lease's
// value names it, or (group) it is among the group's holders. One read,
// no write.
func (n *Node) Holds(ctx context.Context, key, owner string, group bool) (bool, error) {
	if group {
		err := n.Client.ZScore(ctx, n.HoldersKey(key), owner).Err()
		if errors.Is(err, redis.Nil) {
			return false, nil
		}
		return err == nil, err
	}
	v, err := n.Client.Get(ctx, n.LockKey(key)).Result()
	if errors.Is(err, redis.Nil) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	return !strings.HasPrefix(v, "|") && ParseValue(v).Owner == owner, nil
}
