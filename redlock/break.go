package redlock

import (
	"context"
	"fmt"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/background"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// Break implements dlock.Breaker (see dlock.Break) on every node in
// parallel: on each node one script removes the lease (owner "": whoever's
// it is; else owner's only) and wakes the node's first queued waiter, as a
// release without a token does. The quorum counters are left alone, so the
// next token is above the broken one. Broken.Nodes names every node a
// lease was removed from. A break that fewer than a majority of nodes
// answered fails (the leases removed on the others stay removed);
// otherwise the nodes that failed are listed in Broken.NodeErrors, and
// their copies of the lease expire with its TTL. It waits for a majority
// up to ten node timeouts, and for the other nodes until the node timeout
// has passed since the call began (at least a quarter of what the majority
// took); the end of ctx ends every wait, and every request ends with the
// call. The broken holder learns of it as the package's Guarantees say.
// Details: docs/redlock.md.
//
// Not guaranteed: a break racing the holder's own Release is decided node
// by node; both may report success, the result naming the holder on the
// nodes the break won only. Check Broken.Nodes against the quorum before
// saying a lock was broken.
func (l *Locker) Break(ctx context.Context, key, owner string) (dlock.Broken, error) {
	return l.engine().Break(ctx, key, owner)
}

// Break implements driver.Breaker.
func (b *backend) Break(ctx context.Context, key, owner string) (driver.BreakResult, error) {
	type broke struct {
		i               int
		removed, others []redisproto.Info
		err             error
	}
	// A majority is waited for up to breakPatience node timeouts (within
	// ctx): a break has no lease validity to keep, and a node a little
	// slower than the node timeout (a loaded machine) must not fail it.
	// The nodes beyond a majority get the rest of the node timeout (at
	// least a quarter of what the majority took). Every request ends with
	// the call: none is retried by its client after Break has returned.
	timeout := b.timeout(dlock.DefaultTTL)
	start := time.Now()
	wait := breakPatience * timeout
	bctx, stop := context.WithCancel(ctx) // the timer below bounds the wait
	defer stop()
	ch := make(chan broke, len(b.nodes)) // buffered: a late node never blocks
	for i, n := range b.nodes {
		background.Go(func() {
			r, o, err := n.QuorumBreak(bctx, key, owner)
			ch <- broke{i, r, o, err}
		})
	}
	var (
		res      driver.BreakResult
		answered = make([]bool, len(b.nodes))
		oks      int
	)
	// Tokens of one lease differ between nodes that recorded it (by its
	// grant or its commit) and those that did not (0, or a proposal that
	// fell short on a majority): report each owner with its highest.
	top := map[string]uint64{}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	for got := 0; got < len(b.nodes) && got-oks <= len(b.nodes)-b.quorum; {
		select {
		case r := <-ch:
			got++
			answered[r.i] = true
			name := b.nodes[r.i].name
			if r.err != nil {
				res.NodeErrs = append(res.NodeErrs, fmt.Errorf("%s: %w", name, r.err))
				continue
			}
			if oks++; oks == b.quorum {
				timer.Reset(max(time.Until(start.Add(timeout)), time.Since(start)/4))
			}
			for _, in := range r.removed {
				res.Removed = append(res.Removed, nodeHeld(in, name))
				top[in.Owner] = max(top[in.Owner], in.Token)
			}
			for _, in := range r.others {
				res.Others = append(res.Others, nodeHeld(in, name))
				top[in.Owner] = max(top[in.Owner], in.Token)
			}
		case <-ctx.Done():
			got = len(b.nodes)
		case <-timer.C:
			got = len(b.nodes)
		}
	}
	silent := fmt.Sprintf("no answer within %v", time.Since(start).Round(time.Millisecond))
	if len(res.NodeErrs) > len(b.nodes)-b.quorum {
		silent = "not awaited: the nodes that failed make a majority impossible"
	}
	for i, ok := range answered {
		if !ok {
			res.NodeErrs = append(res.NodeErrs, fmt.Errorf("%w: %s: %s", dlock.ErrUnavailable, b.nodes[i].name, silent))
		}
	}
	for i := range res.Removed {
		res.Removed[i].Token = top[res.Removed[i].Owner]
	}
	for i := range res.Others {
		res.Others[i].Token = top[res.Others[i].Owner]
	}
	if oks < b.quorum {
		if err := ctx.Err(); err != nil {
			return driver.BreakResult{}, err
		}
		return driver.BreakResult{}, fmt.Errorf("%w: redlock break %q: %d of %d nodes answered, %d needed (removed on %d): %v",
			dlock.ErrUnavailable, key, oks, len(b.nodes), b.quorum, len(res.Removed), res.NodeErrs)
	}
	if len(res.Removed) > 0 {
		res.Others = nil
	}
	return res, nil
}

// breakPatience is how many node timeouts Break waits for a majority's
// answers.
const breakPatience = 10

func nodeHeld(in redisproto.Info, node string) driver.Held {
	return driver.Held{Owner: in.Owner, Token: in.Token, Metadata: in.Metadata, TTL: in.TTL, Mode: driver.Exclusive, Node: node}
}
