// Orphans: entries nobody uses any more that may still exist on the server
// (a failed delete, a create with an unknown outcome, an abandoned wait),
// and their deletes (sweep), retried before the next attempt on the key and
// after each keep-alive of their lease.

package etcdlock

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/background"
)

// abandon removes a waiter's entry in the background (bounded by
// dlock.DefaultReleaseTimeout); if that fails, the entry stays an orphan
// and its delete is retried later.
func (e *entry) abandon() {
	e.b.orphan(e, false)
	background.Go(func() {
		ctx, cancel := context.WithTimeout(context.Background(), dlock.DefaultReleaseTimeout)
		defer cancel()
		_ = e.b.sweep(ctx, []*entry{e})
	})
}

// sweepKey deletes this Locker's orphans of key before a new attempt on
// it, so that a stale entry of ours is never in the way (best effort).
func (b *backend) sweepKey(ctx context.Context, key string) {
	b.mu.Lock()
	if len(b.orphans) == 0 {
		b.mu.Unlock()
		return
	}
	var es []*entry
	for e := range b.orphans {
		if e.key == key {
			es = append(es, e)
		}
	}
	b.mu.Unlock()
	if len(es) > 0 {
		_ = b.sweep(ctx, es)
	}
}

// sweepSession deletes s's orphans (after a keep-alive of s), so that they
// do not linger while other locks keep the shared lease alive.
func (b *backend) sweepSession(ctx context.Context, s *session) {
	b.mu.Lock()
	if len(b.orphans) == 0 {
		b.mu.Unlock()
		return
	}
	var es []*entry
	for _, e := range s.slots {
		if e.state == entryOrphan {
			es = append(es, e)
		}
	}
	b.mu.Unlock()
	if len(es) > 0 {
		_ = b.sweep(ctx, es)
	}
}

// sweep deletes orphaned entries, each only if it is still the one we
// know: by create revision, or, for a create whose outcome is unknown, by
// value (it holds the attempt's unique owner id). An entry whose release
// was sent with an unknown outcome is deleted as a release is: with its
// receipt, and if it is gone its receipt tells whether a release of ours
// deleted it. One transaction per maxTxnOps - maxSpentOps entries, which
// also deletes spent receipts.
func (b *backend) sweep(ctx context.Context, es []*entry) error {
	const per = maxTxnOps - maxSpentOps
	for lo := 0; lo < len(es); lo += per {
		var revoke []*session
		var todo []*entry
		var ops []clientv3.Op
		var receipts []string
		b.mu.Lock()
		for _, e := range es[lo:min(lo+per, len(es))] {
			if e.deletedByUs { // a release settled it meanwhile
				if b.goneLocked(e) {
					revoke = append(revoke, e.s)
				}
				continue
			}
			cmp := clientv3.Compare(clientv3.CreateRevision(e.myKey), "=", e.rev)
			then := []clientv3.Op{clientv3.OpDelete(e.myKey)}
			var els []clientv3.Op
			receipt := ""
			switch {
			case e.rev == 0:
				cmp = clientv3.Compare(clientv3.Value(e.myKey), "=", e.val)
			case e.released:
				receipt = e.receiptKey()
				then = append(then, clientv3.OpPut(receipt, "", clientv3.WithLease(e.s.id)))
				els = []clientv3.Op{clientv3.OpGet(receipt, clientv3.WithCountOnly())}
			}
			todo = append(todo, e)
			receipts = append(receipts, receipt)
			ops = append(ops, clientv3.OpTxn([]clientv3.Cmp{cmp}, then, els))
		}
		var spent []clientv3.Op
		if len(todo) > 0 {
			spent = b.takeSpentLocked()
		}
		b.mu.Unlock()
		if len(todo) > 0 {
			rctx, cancel := b.rpc(ctx)
			resp, err := b.client.Txn(rctx).Then(append(ops, spent...)...).Commit()
			cancel()
			if err != nil {
				b.giveBackSpent(spent)
				for _, s := range revoke {
					b.revoke(s)
				}
				return fmt.Errorf("dlock: etcd delete of a stale queue entry: %w", err)
			}
			b.mu.Lock()
			for i, e := range todo {
				r := resp.Responses[i].GetResponseTxn()
				deleted := r.GetSucceeded()
				if deleted || (receipts[i] != "" && hasReceipt(r.GetResponses())) {
					e.deletedByUs = true
					if receipts[i] != "" {
						b.spent[receipts[i]] = struct{}{}
					}
				}
				// By revision, a missing entry can never come back; by
				// value, only a delete proves that the late create is spent.
				if (deleted || e.rev != 0) && b.goneLocked(e) {
					revoke = append(revoke, e.s)
				}
			}
			b.mu.Unlock()
		}
		for _, s := range revoke {
			b.revoke(s)
		}
	}
	return nil
}
