// The held lock: an entry as a driver.Lease, renewed (Refresh, RefreshBatch)
// and released. The etcd lease under it is its session (session.go).

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
