// Listing: List and the Info it returns about each held lock.

package etcdlock

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// Info describes a held lock.
type Info struct {
	Key      string            `json:"key"`
	Owner    string            `json:"owner"`
	Token    uint64            `json:"token"`
	TTL      time.Duration     `json:"ttl"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// Waiters is the number of queue entries behind the holder.
	Waiters int `json:"waiters"`
	// Lease is the holder's etcd lease id.
	Lease int64 `json:"lease"`
}

// List returns the held locks whose name starts with prefix: every queue
// "<EscapeKey(name)>/<lease hex>" with a leased key, the holder being the
// entry with the lowest create revision (etcdctl's locks included; their
// names are shown as they are, unescaped). Release receipts (see
// Release) are not locks and are skipped.
func (l *Locker) List(ctx context.Context, prefix string) ([]Info, error) {
	if ctx == nil {
		return nil, errNilContext
	}
	b := l.b
	if err := b.check(); err != nil {
		return nil, err
	}
	ctx, cancel := b.rpc(ctx)
	defer cancel()
	resp, err := b.client.Get(ctx, b.prefix+EscapeKey(prefix), clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, fmt.Errorf("dlock: etcd list: %w", err)
	}
	byName := map[string]*Info{}
	var order []string
	for _, kv := range resp.Kvs {
		if isReceipt(string(kv.Key)) {
			continue
		}
		k := strings.TrimPrefix(string(kv.Key), b.prefix)
		i := strings.LastIndexByte(k, '/')
		if i <= 0 || kv.Lease == 0 {
			continue
		}
		if _, err := strconv.ParseUint(k[i+1:], 16, 64); err != nil {
			continue
		}
		name := unescapeKey(k[:i])
		if in := byName[name]; in != nil {
			in.Waiters++
			continue
		}
		v := parseValue(kv.Value)
		byName[name] = &Info{Key: name, Owner: v.Owner, Token: uint64(kv.CreateRevision), Metadata: v.Metadata, Lease: kv.Lease}
		order = append(order, name)
	}
	out := make([]Info, 0, len(order))
	for _, name := range order {
		in := byName[name]
		ttl, err := b.client.TimeToLive(ctx, clientv3.LeaseID(in.Lease))
		if err != nil {
			if ctx.Err() != nil {
				return nil, fmt.Errorf("dlock: etcd list: %w", err)
			}
		} else if ttl.TTL > 0 {
			in.TTL = time.Duration(ttl.TTL) * time.Second
		}
		out = append(out, *in)
	}
	return out, nil
}
