// Listing: List (dlock.Lister) reads every queue under a prefix and
// reports each held key's holder and waiters.

package etcdlock

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// List implements dlock.Lister: the held locks whose name starts with
// prefix, sorted by name. Every queue "<EscapeKey(name)>/<lease hex>" with
// a leased key is a lock (etcdctl's locks included; their names are shown
// as they are, unescaped, and their holder, which has no dlock owner id,
// as "lease <hex>"). Each Info has the key's mode (its head's) and, for a
// semaphore, its limit; its Holders (see holdersOf: the head, and the
// shared or limited entries that hold with it), each with its owner,
// token, metadata, mode and the time left on its lease; and Waiters, the
// number of entries that do not hold. Release receipts (see Release) are
// not locks and are skipped. prefix is matched against the escaped names.
func (l *Locker) List(ctx context.Context, prefix string) ([]dlock.Info, error) {
	return l.engine().List(ctx, prefix)
}

// ListHeld lists the keys held under prefix for the Engine's List, which
// checks the arguments, returns by ctx's deadline, fills HeldFor and sorts.
func (b *backend) ListHeld(ctx context.Context, prefix string) ([]dlock.Info, error) {
	ctx, cancel := b.rpc(ctx)
	defer cancel()
	resp, err := b.client.Get(ctx, b.prefix+EscapeKey(prefix), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, fmt.Errorf("dlock: etcd list: %w", err)
	}
	queues := map[string][]*mvccpb.KeyValue{}
	for _, kv := range resp.Kvs {
		if name, ok := b.lockName(kv); ok {
			queues[name] = append(queues[name], kv)
		}
	}
	ttls := map[int64]time.Duration{}
	out := make([]dlock.Info, 0, len(queues))
	for name, q := range queues {
		hs := holdersOf(q)
		m, n := modeOf(q[0])
		info := dlock.Info{Key: name, Mode: dlock.Mode(m), Holders: holdersList(hs), Waiters: len(q) - len(hs)}
		if m == driver.Limited {
			info.Limit = n
		}
		for i, kv := range hs {
			ttl, ok := ttls[kv.Lease]
			if !ok {
				r, err := b.client.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
				if err != nil && ctx.Err() != nil {
					return nil, fmt.Errorf("dlock: etcd list: %w", err)
				}
				if err == nil && r.TTL > 0 {
					ttl = time.Duration(r.TTL) * time.Second
				}
				ttls[kv.Lease] = ttl
			}
			info.Holders[i].TTL = ttl
		}
		out = append(out, info)
	}
	slices.SortFunc(out, func(a, b dlock.Info) int { return cmp.Compare(a.Key, b.Key) })
	return out, nil
}

// lockName returns the name of the lock whose queue entry kv is, and
// false for a key that is not a queue entry (a receipt, an unleased key, a
// key whose last segment is not a lease id in hex).
func (b *backend) lockName(kv *mvccpb.KeyValue) (string, bool) {
	if isReceipt(string(kv.Key)) || kv.Lease == 0 {
		return "", false
	}
	k := strings.TrimPrefix(string(kv.Key), b.prefix)
	i := strings.LastIndexByte(k, '/')
	if i <= 0 {
		return "", false
	}
	if _, err := strconv.ParseUint(k[i+1:], 16, 64); err != nil {
		return "", false
	}
	return unescapeKey(k[:i]), true
}
