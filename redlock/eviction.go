package redlock

import (
	"context"
	"fmt"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/background"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// EvictionError is returned by Acquire and TryAcquire when a node may
// evict keys under memory pressure: its maxmemory is set and its
// maxmemory-policy is not noeviction (volatile-* policies included: lock
// keys carry a TTL). An evicted lease counts as that node's grant to the
// next caller, as a restart without persistence would. It unwraps to
// dlock.ErrUnsupported. Set maxmemory-policy noeviction on the node, or
// pass WithUnsafeEviction to accept the risk.
type EvictionError struct {
	// Node names the node (as in NodeResult); MaxMemory is its maxmemory
	// in bytes and Policy its maxmemory-policy.
	Node      string
	MaxMemory int64
	Policy    string
}

func (e *EvictionError) Error() string {
	return fmt.Sprintf("dlock: redlock node %s may evict lock keys (maxmemory %d, maxmemory-policy %s): "+
		"an evicted lease lets that node grant the lock again while its holder runs on; "+
		"set maxmemory-policy noeviction (or maxmemory 0), or pass redlock.WithUnsafeEviction() to accept the risk",
		e.Node, e.MaxMemory, e.Policy)
}

// Unwrap returns dlock.ErrUnsupported.
func (e *EvictionError) Unwrap() error { return dlock.ErrUnsupported }

// checkEviction asks every node, concurrently and once per node, and
// refuses a node that may evict. It waits only until a majority of nodes
// answered, like an attempt: a slow or dead node neither delays nor fails
// the attempt. A node that has not answered is refused once it does (the
// answer is kept for the next attempt); one that gave no answer within
// timeout is asked again in the background on later attempts.
func (b *backend) checkEviction(ctx context.Context, timeout time.Duration) error {
	if b.unsafeEviction {
		return nil
	}
	ask := func(n *node) (answered bool, err error) {
		cctx, cancel := context.WithTimeout(context.Background(), timeout)
		defer cancel()
		ev, err, abandoned := redisproto.Await(cctx, n.Eviction)
		if err != nil || abandoned {
			n.unanswered.Store(true)
			return false, nil
		}
		n.unanswered.Store(false)
		if ev.Evicts() {
			e := &EvictionError{Node: n.name, MaxMemory: ev.MaxMemory, Policy: ev.Policy}
			n.evicts.Store(e)
			return true, e
		}
		return true, nil
	}
	// A node known to evict is refused at once, whether or not it was
	// among the majority whose answers the attempt that asked it read.
	for _, n := range b.nodes {
		if e := n.evicts.Load(); e != nil {
			return e
		}
	}
	// Once every node's reading is known (the check's answers are cached
	// per node), an attempt starts no goroutine for it.
	known := 0
	for _, n := range b.nodes {
		ev, ok := n.KnownEviction()
		switch {
		case !ok:
		case ev.Evicts():
			e := &EvictionError{Node: n.name, MaxMemory: ev.MaxMemory, Policy: ev.Policy}
			n.evicts.Store(e)
			return e
		default:
			known++
		}
	}
	if known == len(b.nodes) {
		return nil
	}
	type result struct {
		answered bool
		err      error
	}
	results := make(chan result, len(b.nodes))
	pending := 0
	for _, n := range b.nodes {
		if n.unanswered.Load() {
			if n.rechecking.CompareAndSwap(false, true) {
				background.Go(func() {
					defer n.rechecking.Store(false)
					_, _ = ask(n)
				})
			}
			continue
		}
		pending++
		background.Go(func() {
			answered, err := ask(n)
			results <- result{answered, err}
		})
	}
	for ok := 0; pending > 0 && ok < b.quorum; pending-- {
		select {
		case r := <-results:
			if r.err != nil {
				return r.err
			}
			if r.answered {
				ok++
			}
		case <-ctx.Done():
			return nil // the attempt reports the context's end
		}
	}
	return nil
}
