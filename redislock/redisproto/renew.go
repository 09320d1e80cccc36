package redisproto

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/internal/background"
)

// Renewal is one lease to extend in RefreshBatch.
type Renewal struct {
	Key, Owner string
	TTL        time.Duration
	// Group marks a shared or limited holder's lease (refresh_group.lua).
	Group bool
	// Value, when set, is the exclusive lease's whole value, renewed by
	// the Lua-free protocol's CAS (see TairRefresh) instead of a script.
	Value string
}

// refreshCmd queues r's renewal script on p: EVALSHA, or EVAL when eval
// is set (the server lacked the script).
func (n *Node) refreshCmd(ctx context.Context, p redis.Pipeliner, r Renewal, eval bool) *redis.Cmd {
	if r.Value != "" {
		return p.Do(ctx, "CAS", n.LockKey(r.Key), r.Value, r.Value, "PX", msUp(r.TTL))
	}
	s, keys, args := refreshScript, []string{n.LockKey(r.Key)}, []any{r.Owner + "|", Ms(r.TTL)}
	if r.Group {
		lk := keys[0]
		s, keys, args = refreshGroupScript, []string{lk, lk + holdersSuffix, lk + holderDataSuffix}, []any{r.Owner, Ms(r.TTL)}
	}
	if eval {
		return s.Eval(ctx, p, keys, args...)
	}
	return s.EvalSha(ctx, p, keys, args...)
}

// RefreshBatch extends many leases with compare-and-pexpire scripts, one
// pipeline per server, and calls report(i, held, err) once for each
// renewal as soon as its server answered (held is false when owner no
// longer holds the key). With Acks, each pipeline ends with one WAIT that
// covers all its renewals; a renewal that took effect but fewer replicas
// acknowledged is reported held, with an *AckError. On a Cluster the renewals are grouped by the
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
	var wait *redis.Cmd // with Acks: one WAIT after the renewals covers them all
	_, _ = n.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for k, i := range idx {
			cmds[k] = n.refreshCmd(ctx, p, rs[i], false)
		}
		if n.Acks > 0 {
			wait = waitCmd(ctx, p, n.Acks, n.AckTimeout)
		}
		return nil
	})
	ack := ackResult(wait, n.Acks, n.AckTimeout)
	var missing []int // positions in idx whose script the server lacked
	for k, c := range cmds {
		v, err := c.Int64()
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			missing = append(missing, k)
			continue
		}
		report(idx[k], v == 1, acked(v == 1, err, ack))
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
	wait = nil
	_, _ = n.Client.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, k := range missing {
			i := idx[k]
			cmds = append(cmds, n.refreshCmd(ctx, p, rs[i], true))
		}
		if n.Acks > 0 {
			wait = waitCmd(ctx, p, n.Acks, n.AckTimeout)
		}
		return nil
	})
	ack = ackResult(wait, n.Acks, n.AckTimeout)
	for j, c := range cmds {
		v, err := c.Int64()
		report(idx[missing[j]], v == 1, acked(v == 1, err, ack))
	}
}
