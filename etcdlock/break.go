// Breaking: an operator's removal of a lock's holders (dlock.Break).

package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock/driver"
)

// maxBreakRounds bounds the read-and-delete rounds of a Break whose queue
// keeps changing under it.
const maxBreakRounds = 16

// Break implements driver.Breaker.
func (b *backend) Break(ctx context.Context, key, owner string) (driver.BreakResult, error) {
	pfx := b.queuePrefix(key)
	for range maxBreakRounds {
		rctx, cancel := b.rpc(ctx)
		resp, err := b.client.Get(rctx, pfx, inOrder()...)
		cancel()
		if err != nil {
			return driver.BreakResult{}, fmt.Errorf("dlock: etcd break %q: %w", key, err)
		}
		var q []*mvccpb.KeyValue
		for _, kv := range resp.Kvs {
			if kv.Lease != 0 {
				q = append(q, kv)
			}
		}
		var res driver.BreakResult
		var cmps []clientv3.Cmp
		var dels []clientv3.Op
		for _, kv := range holdersOf(q) {
			h := held(kv)
			if owner != "" && h.Owner != owner {
				res.Others = append(res.Others, h)
				continue
			}
			res.Removed = append(res.Removed, h)
			cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(string(kv.Key)), "=", kv.CreateRevision))
			dels = append(dels, clientv3.OpDelete(string(kv.Key)))
		}
		if len(res.Removed) == 0 {
			return res, nil
		}
		res.Others = nil
		if len(dels) > maxTxnOps {
			return driver.BreakResult{}, fmt.Errorf("dlock: etcd break %q: %d holders, more than one transaction takes (%d)", key, len(dels), maxTxnOps)
		}
		b.ttls(ctx, res.Removed, q)
		rctx, cancel = b.rpc(ctx)
		tr, err := b.client.Txn(rctx).If(cmps...).Then(dels...).Commit()
		cancel()
		if err != nil {
			return driver.BreakResult{}, fmt.Errorf("dlock: etcd break %q: %w", key, err)
		}
		if tr.Succeeded {
			return res, nil
		}
		if err := ctx.Err(); err != nil {
			return driver.BreakResult{}, err
		}
	}
	return driver.BreakResult{}, fmt.Errorf("dlock: etcd break %q: %w", key, errBreakBusy)
}

var errBreakBusy = errors.New("the queue's holders kept changing; try again")

// held is a queue entry as a driver.Held (TTL unset).
func held(kv *mvccpb.KeyValue) driver.Held {
	h := holderOf(kv)
	return driver.Held{Owner: h.Owner, Token: h.Token, Metadata: h.Metadata, Mode: driver.Mode(h.Mode)}
}

// ttls fills in the time left on the leases of hs (the entries of q they
// came from), best effort: a lease whose TTL cannot be read keeps 0.
func (b *backend) ttls(ctx context.Context, hs []driver.Held, q []*mvccpb.KeyValue) {
	byToken := map[uint64]int64{}
	for _, kv := range q {
		byToken[uint64(kv.CreateRevision)] = kv.Lease
	}
	for i := range hs {
		rctx, cancel := b.rpc(ctx)
		r, err := b.client.TimeToLive(rctx, clientv3.LeaseID(byToken[hs[i].Token]))
		cancel()
		if err == nil && r.TTL > 0 {
			hs[i].TTL = time.Duration(r.TTL) * time.Second
		}
	}
}
