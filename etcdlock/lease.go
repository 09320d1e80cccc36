// The held lock: an entry as a driver.Lease, renewed (Refresh, RefreshBatch)
// and released, and its loss notification (driver.LossNotifier): a held
// lock watches its own entry and is lost at once when it is deleted behind
// the holder's back. The etcd lease under it is its session (session.go).

package etcdlock

import (
	"context"
	"fmt"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock/driver"
)

// Refresh implements driver.Lease: keep the lease alive and check the queue
// key is still ours.
func (e *entry) Refresh(ctx context.Context, ttl time.Duration) error {
	var out error
	e.b.RefreshBatch(ctx, []driver.Renewal{{Lease: e, TTL: ttl}}, func(_ int, err error) { out = err })
	return out
}

// Release implements driver.Lease: delete the queue key only if it still
// has our create revision, so a retried release never deletes a newer
// holder's key, and in the same transaction put the entry's receipt on its
// lease. A release that finds the entry gone returns nil if its receipt is
// there (an earlier release of ours deleted it and its reply was lost),
// and an error wrapping dlock.ErrNotHeld otherwise.
func (e *entry) Release(ctx context.Context) error {
	b := e.b
	b.mu.Lock()
	if e.deletedByUs {
		b.mu.Unlock()
		return nil
	}
	e.released = true
	spent := b.takeSpentLocked()
	b.mu.Unlock()
	receipt := e.receiptKey()
	rctx, cancel := b.rpc(ctx)
	resp, err := b.client.Txn(rctx).
		If(clientv3.Compare(clientv3.CreateRevision(e.myKey), "=", e.rev)).
		Then(append([]clientv3.Op{clientv3.OpDelete(e.myKey), clientv3.OpPut(receipt, "", clientv3.WithLease(e.s.id))}, spent...)...).
		Else(append([]clientv3.Op{clientv3.OpGet(receipt, clientv3.WithCountOnly())}, spent...)...).
		Commit()
	cancel()
	if err != nil {
		// It may or may not be deleted: keep its slot, retry the delete.
		b.giveBackSpent(spent)
		b.orphan(e, false)
		return unreachable(fmt.Errorf("dlock: etcd release %q: %w", e.key, err))
	}
	b.mu.Lock()
	if resp.Succeeded || hasReceipt(resp.Responses) {
		e.deletedByUs = true
		b.spent[receipt] = struct{}{}
	}
	// A retried delete of ours (sweep) may have settled it meanwhile, and
	// its receipt may already be deleted as spent.
	deletedByUs := e.deletedByUs
	r := b.goneLocked(e)
	b.mu.Unlock()
	if r {
		b.revoke(e.s)
	}
	if deletedByUs {
		return nil
	}
	return e.notHeld("deleted before release, not by a request of this lock")
}

// RefreshBatch implements driver.BatchRenewer: per distinct lease, one
// keep-alive and one transaction (per 128 keys) reading its entries, both
// at once; each lease's renewals are reported as soon as both answered, so
// a slow lease delays only its own locks.
func (b *backend) RefreshBatch(ctx context.Context, rs []driver.Renewal, done func(int, error)) {
	bySession := map[*session][]int{}
	var order []*session
	for i, r := range rs {
		s := r.Lease.(*entry).s
		if bySession[s] == nil {
			order = append(order, s)
		}
		bySession[s] = append(bySession[s], i)
	}
	var wg sync.WaitGroup
	for _, s := range order {
		wg.Go(func() { b.refreshSession(ctx, s, rs, bySession[s], done) })
	}
	wg.Wait()
}

// refreshSession renews the lease s and checks the entries rs[idx] on it.
func (b *backend) refreshSession(ctx context.Context, s *session, rs []driver.Renewal, idx []int, done func(int, error)) {
	ka := make(chan error, 1)
	go func() { ka <- b.keepAlive(ctx, s) }()
	kvs := make([]*mvccpb.KeyValue, len(idx))
	var readErr error
	for lo := 0; lo < len(idx); lo += maxTxnOps {
		hi := min(lo+maxTxnOps, len(idx))
		ops := make([]clientv3.Op, 0, hi-lo)
		for _, i := range idx[lo:hi] {
			ops = append(ops, clientv3.OpGet(rs[i].Lease.(*entry).myKey, clientv3.WithKeysOnly()))
		}
		rctx, cancel := b.rpc(ctx)
		resp, err := b.client.Txn(rctx).Then(ops...).Commit()
		cancel()
		if err != nil {
			readErr = err
			break
		}
		for j, rr := range resp.Responses {
			if got := rr.GetResponseRange().Kvs; len(got) > 0 {
				kvs[lo+j] = got[0]
			}
		}
	}
	kaErr := <-ka
	for j, i := range idx {
		e := rs[i].Lease.(*entry)
		var err error
		switch {
		case kaErr != nil:
			err = kaErr
		case readErr != nil:
			err = unreachable(fmt.Errorf("dlock: etcd refresh %q: %w", e.key, readErr))
		case kvs[j] == nil || kvs[j].CreateRevision != e.rev:
			err = e.notHeld("deleted or replaced behind the holder's back")
			e.b.goneUnlessReleased(e)
		}
		done(i, err)
	}
	// Orphans on this lease would live as long as these locks keep it alive.
	if kaErr == nil {
		b.sweepSession(ctx, s)
	}
}

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
