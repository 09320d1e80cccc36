package etcdlock

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
)

// DefaultGuardPrefix is where guards keep fences: "<prefix><resource>".
const DefaultGuardPrefix = "dlock/guard/"

// maxGuardConflicts bounds the retries of a fenced transaction that lost a
// race with another writer of the same fence.
const maxGuardConflicts = 16

// Guard fences writes (and reads) to data kept in etcd: a transaction
// applies the caller's operations only if the fence key still holds what
// was read and the caller's fence is admissible, recording the new fence in
// the same transaction.
//
// Every method returns by its context's deadline (clientv3 bounds each
// request by its context) with an error wrapping the context's error. A
// write abandoned there may still take effect; it stays fenced, since the
// fence comparison is part of the transaction.
type Guard struct {
	client *clientv3.Client
	prefix string
}

// NewGuard returns a Guard on client keeping fences under prefix
// (DefaultGuardPrefix if empty).
func NewGuard(client *clientv3.Client, prefix string) *Guard {
	if prefix == "" {
		prefix = DefaultGuardPrefix
	}
	return &Guard{client: client, prefix: prefix}
}

// FenceKey is the key holding resource's highest accepted fence.
func (g *Guard) FenceKey(resource string) string { return g.prefix + resource }

func parseFence(v []byte) dlock.Fence {
	tok, owner, _ := strings.Cut(string(v), "|")
	t, _ := strconv.ParseUint(tok, 10, 64)
	return dlock.Fence{Token: t, Owner: owner}
}

// Txn runs ops in one etcd transaction fenced by f and returns its
// response (ops' results follow the fence write: Responses[1:]). A stale
// fence returns a *dlock.StaleTokenError and runs nothing.
func (g *Guard) Txn(ctx context.Context, resource string, f dlock.Fence, ops ...clientv3.Op) (*clientv3.TxnResponse, error) {
	if ctx == nil {
		return nil, errNilContext
	}
	if g.client == nil {
		return nil, fmt.Errorf("%w: etcdlock.NewGuard was given a nil etcd client", dlock.ErrNilClient)
	}
	if err := dlock.ValidateKey(resource); err != nil {
		return nil, err
	}
	fk := g.FenceKey(resource)
	for attempt := 0; attempt < maxGuardConflicts; attempt++ {
		cur, err := g.client.Get(ctx, fk)
		if err != nil {
			return nil, fmt.Errorf("dlock: etcd guard %q: %w", resource, err)
		}
		var hi dlock.Fence
		var modRev int64
		if len(cur.Kvs) > 0 {
			hi, modRev = parseFence(cur.Kvs[0].Value), cur.Kvs[0].ModRevision
		}
		if !hi.Admits(f) {
			return nil, &dlock.StaleTokenError{Resource: resource, Token: f.Token, Owner: f.Owner, Highest: hi.Token}
		}
		put := clientv3.OpPut(fk, strconv.FormatUint(f.Token, 10)+"|"+f.Owner)
		resp, err := g.client.Txn(ctx).
			If(clientv3.Compare(clientv3.ModRevision(fk), "=", modRev)).
			Then(append([]clientv3.Op{put}, ops...)...).
			Commit()
		if err != nil {
			return nil, fmt.Errorf("dlock: etcd guard %q: %w", resource, err)
		}
		if resp.Succeeded {
			return resp, nil
		}
		// Another fenced writer got in between: read the fence again.
	}
	return nil, fmt.Errorf("dlock: etcd guard %q: fence kept changing (%d conflicts)", resource, maxGuardConflicts)
}

// Put writes key = value fenced by f.
func (g *Guard) Put(ctx context.Context, resource string, f dlock.Fence, key, value string) error {
	_, err := g.Txn(ctx, resource, f, clientv3.OpPut(key, value))
	return err
}

// Get reads key fenced by f (a fenced read: once it succeeds, older fences
// can no longer write). ok is false when the key does not exist.
func (g *Guard) Get(ctx context.Context, resource string, f dlock.Fence, key string) (value string, ok bool, err error) {
	resp, err := g.Txn(ctx, resource, f, clientv3.OpGet(key))
	if err != nil {
		return "", false, err
	}
	kvs := resp.Responses[1].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return "", false, nil
	}
	return string(kvs[0].Value), true, nil
}

// Highest returns the highest fence resource has accepted.
func (g *Guard) Highest(ctx context.Context, resource string) (dlock.Fence, error) {
	if ctx == nil {
		return dlock.Fence{}, errNilContext
	}
	if g.client == nil {
		return dlock.Fence{}, dlock.ErrNilClient
	}
	resp, err := g.client.Get(ctx, g.FenceKey(resource))
	if err != nil {
		return dlock.Fence{}, fmt.Errorf("dlock: etcd guard %q: %w", resource, err)
	}
	if len(resp.Kvs) == 0 {
		return dlock.Fence{}, nil
	}
	return parseFence(resp.Kvs[0].Value), nil
}
