package redlock

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
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

// WithUnsafeEviction lets a Locker use nodes that may evict keys under
// memory pressure, which it otherwise refuses with an *EvictionError.
func WithUnsafeEviction() Option {
	return driver.Setting(func(o *options) { o.unsafeEviction = true })
}

// checkEviction asks every node, concurrently and once per node, and
// refuses the first that may evict. A node that gave no answer (down,
// timed out) does not hold up later attempts: it is asked again in the
// background, and refused once it answers that it evicts.
func (b *backend) checkEviction(ctx context.Context, timeout time.Duration) error {
	if b.unsafeEviction {
		return nil
	}
	errs := make([]error, len(b.nodes))
	var wg sync.WaitGroup
	for i, n := range b.nodes {
		ask := func(ctx context.Context) error {
			cctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			ev, err, abandoned := redisproto.Await(cctx, n.Eviction)
			if err != nil || abandoned {
				n.unanswered.Store(true)
				return nil
			}
			n.unanswered.Store(false)
			if ev.Evicts() {
				return &EvictionError{Node: n.name, MaxMemory: ev.MaxMemory, Policy: ev.Policy}
			}
			return nil
		}
		if n.unanswered.Load() {
			if n.rechecking.CompareAndSwap(false, true) {
				background.Go(func() {
					defer n.rechecking.Store(false)
					_ = ask(context.Background())
				})
			}
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = ask(ctx)
		}()
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
