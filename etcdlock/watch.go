// Loss notification: a held lock watches its own entry and is lost at once
// when it is deleted behind the holder's back (driver.LossNotifier).

package etcdlock

import (
	"context"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

const (
	// watchDelay is how long a held lock waits before it watches its own
	// entry: a lock released sooner costs no watch.
	watchDelay = 20 * time.Millisecond
	// maxRewatch bounds how often the watch on a held lock's entry is
	// re-established (after a compaction or a cancelled watch).
	maxRewatch = 1000
)

// Bind implements driver.LossNotifier: watch the lock's own entry from its
// create revision + 1 (so a delete before the watch exists is seen too)
// and report its deletion (a revoked or expired lease, an operator's
// delete) at once, not at the next renewal.
func (e *entry) Bind(lose func(cause error)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	go e.watchOwn(ctx, lose)
	return func() {
		e.b.mu.Lock()
		e.stopped = true
		e.b.mu.Unlock()
		cancel()
	}
}

func (e *entry) watchOwn(ctx context.Context, lose func(cause error)) {
	b := e.b
	// A lock released at once costs no watch: start it a little later
	// (from the create revision + 1, so nothing is missed meanwhile).
	t := time.NewTimer(watchDelay)
	select {
	case <-ctx.Done():
		t.Stop()
		return
	case <-t.C:
	}
	rev := e.rev + 1
	pause := 50 * time.Millisecond
	for i := 0; i < maxRewatch; i++ {
		for wr := range b.client.Watch(ctx, e.myKey, clientv3.WithRev(rev)) {
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.DELETE {
					e.deleted(lose, fmt.Sprintf("deleted behind the holder's back (revision %d)", ev.Kv.ModRevision))
					return
				}
			}
		}
		// The watch ended: the lock ended, the client closed, or etcd
		// cancelled it (a compaction). Read the entry and watch on from
		// there.
		if ctx.Err() != nil || b.client.Ctx().Err() != nil {
			return
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		pause = min(2*pause, 5*time.Second)
		rctx, cancel := b.rpc(ctx)
		g, err := b.client.Get(rctx, e.myKey)
		cancel()
		if err != nil {
			continue
		}
		if len(g.Kvs) == 0 || g.Kvs[0].CreateRevision != e.rev {
			e.deleted(lose, "deleted behind the holder's back")
			return
		}
		rev = g.Header.Revision + 1
	}
}

// deleted reports a deletion seen by the entry's watch, unless the lock
// had already ended (then it may be our own release).
func (e *entry) deleted(lose func(error), why string) {
	b := e.b
	b.mu.Lock()
	if e.stopped {
		b.mu.Unlock()
		return
	}
	r := b.goneLocked(e)
	b.mu.Unlock()
	if r {
		b.revoke(e.s)
	}
	lose(e.notHeld(why))
}
