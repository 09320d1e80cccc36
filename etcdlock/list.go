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
)

// List implements dlock.Lister: the held locks whose name starts with
// prefix, sorted by name. Every queue "<EscapeKey(name)>/<lease hex>" with
// a leased key is a lock, the holder being the entry with the lowest
// create revision (etcdctl's locks included; their names are shown as
// they are, unescaped, and their holder, which has no dlock owner id, as
// "lease <hex>"). Each Info has one Holder (owner, token, metadata and the
// time left on its lease) and Waiters, the number of entries behind it.
// Release receipts (see Release) are not locks and are skipped. prefix is
// matched against the escaped names.
func (l *Locker) List(ctx context.Context, prefix string) ([]dlock.Info, error) {
	if err := l.e.Check(ctx); err != nil {
		return nil, err
	}
	b := l.b
	ctx, cancel := b.rpc(ctx)
	defer cancel()
	resp, err := b.client.Get(ctx, b.prefix+EscapeKey(prefix), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, fmt.Errorf("dlock: etcd list: %w", err)
	}
	type held struct {
		info  dlock.Info
		lease int64
	}
	byName := map[string]*held{}
	for _, kv := range resp.Kvs {
		name, ok := b.lockName(kv)
		if !ok {
			continue
		}
		if h := byName[name]; h != nil {
			h.info.Waiters++
			continue
		}
		byName[name] = &held{info: dlock.Info{Key: name, Mode: dlock.Exclusive, Holders: []dlock.Holder{holderOf(kv)}}, lease: kv.Lease}
	}
	out := make([]dlock.Info, 0, len(byName))
	for _, h := range byName {
		ttl, err := b.client.TimeToLive(ctx, clientv3.LeaseID(h.lease))
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("dlock: etcd list: %w", err)
			}
		} else if ttl.TTL > 0 {
			h.info.Holders[0].TTL = time.Duration(ttl.TTL) * time.Second
		}
		out = append(out, h.info)
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
