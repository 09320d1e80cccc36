package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/redislock"
)

// Per-node state for ls. A redlock:// backend is several independent
// Redis masters: ls lists each one on its own (the same SCAN that
// redlock's List does), shows which node holds what for whom with
// --nodes, warns about the nodes that did not answer, and lists a key
// when a majority of the nodes hold it for the same owner (redlock's
// rule). Backends whose servers replicate one state (etcd, ZooKeeper,
// Sentinel) have no per-node lock state; for them ls only warns about
// the addresses of the URL that do not accept a connection.

// backendNode is one independent node of a backend: a Redlock master.
type backendNode struct {
	addr   string
	lister dlock.Lister
}

// redlockNodes makes a lister per Redlock master, on the backend's own
// clients (closed with it). Redlock and redislock keep a lease under the
// same Redis key (prefix "dlock" on both), so each node lists as a
// one-node Redis backend.
func redlockNodes(addrs []string, clients []redis.UniversalClient) []backendNode {
	nodes := make([]backendNode, len(clients))
	for i, c := range clients {
		nodes[i] = backendNode{addr: addrs[i], lister: redislock.New(c)}
	}
	return nodes
}

// nodeState is what one node answered: its locks, or why it did not.
type nodeState struct {
	addr  string
	infos []dlock.Info
	err   error
}

// listNodes lists every node at once. A node gets until ctx ends to
// answer, except that once a majority has answered the others get grace
// more (--connect-timeout): a stalled node must not hold up every
// refresh of --watch for the whole listing timeout.
func listNodes(ctx context.Context, prefix string, nodes []backendNode, grace time.Duration) []nodeState {
	states := make([]nodeState, len(nodes))
	for i, n := range nodes {
		states[i].addr = n.addr
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // the stragglers return soon: they honour ctx
	type result struct {
		i     int
		infos []dlock.Info
		err   error
	}
	ch := make(chan result, len(nodes)) // buffered: a late node never blocks
	for i, n := range nodes {
		go func() {
			infos, err := n.lister.List(ctx, prefix)
			ch <- result{i, infos, err}
		}()
	}
	quorum := len(nodes)/2 + 1
	answered := make([]bool, len(nodes))
	var late <-chan time.Time
	giveUp := func(why string) {
		for i := range states {
			if !answered[i] {
				states[i].err = fmt.Errorf("%w: no answer %s", dlock.ErrUnavailable, why)
			}
		}
	}
	ok := 0
	for pending := len(nodes); pending > 0; {
		select {
		case r := <-ch:
			pending--
			answered[r.i] = true
			states[r.i].infos, states[r.i].err = r.infos, r.err
			if r.err == nil {
				if ok++; ok == quorum && pending > 0 {
					t := time.NewTimer(grace)
					defer t.Stop()
					late = t.C
				}
			}
		case <-late:
			giveUp(fmt.Sprintf("within %v after a majority answered", grace))
			pending = 0
		case <-ctx.Done():
			giveUp(fmt.Sprintf("before the listing timed out: %v", context.Cause(ctx)))
			pending = 0
		}
	}
	return states
}

// nodeFailure names how a node failed: "refused" when it answered with
// an error (authentication, ...), else "unreachable".
func nodeFailure(err error) string {
	var rerr redis.Error
	if errors.As(err, &rerr) {
		return "refused"
	}
	return "unreachable"
}

// aggregateNodes applies redlock's rule to the nodes' answers: a key is
// held when a majority of all the nodes hold it for the same owner; its
// row has the highest token and the shortest lease among those nodes, and
// Nodes names them. It returns the rows (sorted by key), a warning per
// node that did not answer, and an error when fewer than a majority did:
// nothing can then be said.
func aggregateNodes(states []nodeState) ([]lockInfo, []string, error) {
	n := len(states)
	quorum := n/2 + 1
	var failed []string
	for _, s := range states {
		if s.err != nil {
			failed = append(failed, fmt.Sprintf("%s: %v", s.addr, s.err))
		}
	}
	up := n - len(failed)
	if up < quorum {
		return nil, nil, fmt.Errorf("%w: %d of %d redlock nodes answered, a majority (%d) is needed to list: %s",
			dlock.ErrUnavailable, up, n, quorum, strings.Join(failed, "; "))
	}
	var warnings []string
	for _, s := range states {
		if s.err != nil {
			warnings = append(warnings, fmt.Sprintf("warning: node %s %s: %v; listing from %d/%d nodes", s.addr, nodeFailure(s.err), s.err, up, n))
		}
	}
	type kv struct{ key, owner string }
	agg := map[kv]*lockInfo{}
	for _, s := range states {
		for _, in := range s.infos {
			for _, h := range in.Holders {
				k := kv{in.Key, h.Owner}
				row := agg[k]
				if row == nil {
					row = &lockInfo{Key: in.Key, Mode: dlock.Exclusive.String(), Holders: 1, Owner: h.Owner, Token: h.Token, TTL: h.TTL, Waiters: -1, Metadata: h.Metadata}
					agg[k] = row
				}
				row.Token = max(row.Token, h.Token)
				row.TTL = min(row.TTL, h.TTL)
				row.Nodes = append(row.Nodes, s.addr)
			}
		}
	}
	var rows []lockInfo
	for _, row := range agg {
		if len(row.Nodes) >= quorum {
			rows = append(rows, *row)
		}
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].Key < rows[j].Key })
	return rows, warnings, nil
}

// printNodes prints the per-node table of ls --nodes: a row per lease on
// each node (a row with "-" for a node that holds nothing under the
// prefix or did not answer). QUORUM says whether the lease is part of a
// listed lock (held by a majority for that owner) or a minority's: the
// rest of a failed attempt, or of a lock whose other leases expired.
func printNodes(w io.Writer, states []nodeState, rows []lockInfo) {
	listed := map[string]string{} // key -> owner of the listed lock
	for _, r := range rows {
		listed[r.Key] = r.Owner
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tSTATE\tKEY\tHOLDER\tTOKEN\tTTL-LEFT\tQUORUM")
	for _, s := range states {
		switch {
		case s.err != nil:
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\t-\n", s.addr, nodeFailure(s.err))
		case len(s.infos) == 0:
			fmt.Fprintf(tw, "%s\tok\t-\t-\t-\t-\t-\n", s.addr)
		}
		for _, in := range s.infos {
			for _, h := range in.Holders {
				quorum := "no"
				if owner, ok := listed[in.Key]; ok && owner == h.Owner {
					quorum = "yes"
				}
				token := "-" // a node may keep no token of its own
				if h.Token > 0 {
					token = strconv.FormatUint(h.Token, 10)
				}
				fmt.Fprintf(tw, "%s\tok\t%s\t%s\t%s\t%s\t%s\n", s.addr, quoteField(in.Key), holderField(h.Owner, h.Metadata), token, fmtDur(h.TTL), quorum)
			}
		}
	}
	tw.Flush()
}

// endpointKinds names the servers of the URLs whose several addresses
// serve one replicated state: ls warns about those that do not accept a
// connection.
var endpointKinds = map[string]string{
	"etcd": "etcd endpoint", "etcds": "etcd endpoint",
	"zk":             "zookeeper server",
	"redis+sentinel": "sentinel", "rediss+sentinel": "sentinel",
}

// endpointWarnings dials every address of t (for a URL with several, of
// a kind in endpointKinds) within timeout and returns a warning for each
// that refuses or does not answer. It only tells whether a server accepts
// connections, not whether it is healthy: the clients go to the others.
func endpointWarnings(t *target, timeout time.Duration) []string {
	kind, ok := endpointKinds[t.Scheme]
	if !ok || len(t.Addrs) < 2 || timeout <= 0 { // DialTimeout takes 0 for no bound
		return nil
	}
	errs := make([]error, len(t.Addrs))
	var wg sync.WaitGroup
	for i, a := range t.Addrs {
		wg.Go(func() {
			c, err := net.DialTimeout("tcp", a, timeout)
			if err == nil {
				c.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	up := 0
	for _, err := range errs {
		if err == nil {
			up++
		}
	}
	var warnings []string
	for i, err := range errs {
		if err != nil {
			warnings = append(warnings, fmt.Sprintf("warning: %s %s unreachable: %v; listing through %d/%d %ss", kind, t.Addrs[i], err, up, len(t.Addrs), kind))
		}
	}
	return warnings
}

// holderField is ls's HOLDER column: owner (its first 12 hex digits),
// host and pid, as "owner/host/pid", "-" for each part not known.
func holderField(owner string, md map[string]string) string {
	if len(owner) > 12 {
		owner = owner[:12]
	}
	host, pid := md[dlock.MetaHost], md[dlock.MetaPID]
	if owner == "" && host == "" && pid == "" {
		return "-"
	}
	return quoteField(dash(owner) + "/" + dash(host) + "/" + dash(pid))
}

// fmtDur formats a lease or a hold for a table: milliseconds under a
// minute, seconds above, "-" for 0 (unknown).
func fmtDur(d time.Duration) string {
	switch {
	case d <= 0:
		return "-"
	case d < time.Minute:
		return d.Round(time.Millisecond).String()
	default:
		return d.Round(time.Second).String()
	}
}

// fmtCount formats a count that may be unknown (negative): "-".
func fmtCount(n int) string {
	if n < 0 {
		return "-"
	}
	return strconv.Itoa(n)
}
