// Acquiring: Try (driver.Driver) and Queue (driver.Queuer) put an entry in
// a key's queue; the holder is the entry with the lowest create revision.

package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/background"
)

// notAcquired is the error of an attempt that found the key held by holder
// (nil if unknown). A holder that is not dlock's (etcdctl, a
// concurrency.Mutex) has no owner id: it is named by its lease.
func (b *backend) notAcquired(key string, holder *mvccpb.KeyValue, cause error) *dlock.NotAcquiredError {
	na := &dlock.NotAcquiredError{Key: key, Cause: cause}
	if holder != nil {
		na.Holders = []dlock.Holder{holderOf(holder)}
	}
	return na
}

// holderOf describes the queue entry kv as a holder (TTL unknown: zero).
func holderOf(kv *mvccpb.KeyValue) dlock.Holder {
	v := parseValue(kv.Value)
	h := dlock.Holder{Owner: v.Owner, Token: uint64(kv.CreateRevision), Metadata: v.Metadata, Mode: dlock.Exclusive}
	if h.Owner == "" {
		h.Owner = "lease " + strconv.FormatInt(kv.Lease, 16)
	}
	return h
}

// grant is the Grant of a held entry whose lock counts from start: its TTL
// is the lease's, as etcd applied it.
func (e *entry) grant(start time.Time) driver.Grant {
	return driver.Grant{Lease: e, Token: uint64(e.rev), TTL: e.s.ttl, Start: start}
}

// Try implements driver.Driver in one transaction: put this attempt's
// entry only if the queue is empty, else read its head (the holder).
// Nothing is left behind when the key is held.
func (b *backend) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	b.sweepKey(ctx, req.Key)
	pfx := b.queuePrefix(req.Key)
	for attempt := 0; ; attempt++ {
		e, start, err := b.newEntry(ctx, req, nil)
		if err != nil {
			return driver.Grant{}, err
		}
		rctx, cancel := b.rpc(ctx)
		resp, err := b.client.Txn(rctx).
			If(clientv3.Compare(clientv3.CreateRevision(pfx), "=", 0).WithPrefix()).
			Then(clientv3.OpPut(e.myKey, e.val, clientv3.WithLease(e.s.id))).
			Else(clientv3.OpGet(pfx, clientv3.WithFirstCreate()...)).
			Commit()
		cancel()
		if err != nil {
			if attempt == 0 && b.leaseGone(e, err) {
				continue
			}
			b.unknown(e)
			return driver.Grant{}, fmt.Errorf("dlock: etcd acquire %q: %w", req.Key, err)
		}
		if !resp.Succeeded {
			b.gone(e) // nothing was put
			var holder *mvccpb.KeyValue
			if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
				holder = kvs[0]
			}
			return driver.Grant{}, b.notAcquired(req.Key, holder, nil)
		}
		e.rev = resp.Header.Revision
		return e.grant(start), nil
	}
}

// enqueue puts this attempt's entry in the queue and reports whether it is
// first, with the first entry when it is not.
func (b *backend) enqueue(ctx context.Context, req *driver.Request, peek func()) (*entry, bool, *mvccpb.KeyValue, time.Time, error) {
	pfx := b.queuePrefix(req.Key)
	for attempt := 0; ; attempt++ {
		e, start, err := b.newEntry(ctx, req, peek)
		peek = nil
		if err != nil {
			return nil, false, nil, time.Time{}, err
		}
		rctx, cancel := b.rpc(ctx)
		resp, err := b.client.Txn(rctx).
			If(clientv3.Compare(clientv3.CreateRevision(e.myKey), "=", 0)).
			Then(clientv3.OpPut(e.myKey, e.val, clientv3.WithLease(e.s.id)), clientv3.OpGet(pfx, clientv3.WithFirstCreate()...)).
			Else(clientv3.OpGet(e.myKey)).
			Commit()
		cancel()
		if err != nil {
			if attempt == 0 && b.leaseGone(e, err) {
				continue
			}
			b.unknown(e)
			return nil, false, nil, time.Time{}, fmt.Errorf("dlock: etcd acquire %q: %w", req.Key, err)
		}
		if !resp.Succeeded {
			// An entry of this lease for the key that we had no record of
			// (a create that took effect after we gave up on it). Never
			// adopt it: delete it, and take another lease.
			b.mu.Lock()
			if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
				e.rev, e.val = kvs[0].CreateRevision, string(kvs[0].Value)
			}
			r := b.orphanLocked(e, false)
			b.mu.Unlock()
			if r {
				b.revoke(e.s)
			}
			b.sweepKey(ctx, req.Key)
			if attempt < 2 {
				continue
			}
			return nil, false, nil, time.Time{}, fmt.Errorf("%w: etcd acquire %q: a stale entry of this client was in the way", dlock.ErrTransient, req.Key)
		}
		e.rev = resp.Header.Revision
		head := resp.Responses[1].GetResponseRange()
		if len(head.Kvs) == 0 || head.Kvs[0].CreateRevision == e.rev {
			return e, true, nil, start, nil
		}
		return e, false, head.Kvs[0], start, nil
	}
}

// Queue implements driver.Queuer: wait in key's FIFO queue, watching only
// the entry just ahead (no herd), keeping the lease alive meanwhile. When
// ctx ends while etcd keeps answering, it returns at once a
// *dlock.NotAcquiredError naming the holder (the queue entry is removed in
// the background); when a request fails, or etcd stopped answering, it
// returns that error.
func (b *backend) Queue(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	b.sweepKey(ctx, req.Key)
	sent := time.Now()
	// A new or stale lease costs a round trip before the entry is put:
	// meanwhile, read the head, so that a context ending before the entry
	// is in still reports the holder seen.
	var peeked chan *mvccpb.KeyValue
	peek := func() {
		peeked = make(chan *mvccpb.KeyValue, 1)
		background.Go(func() {
			rctx, cancel := b.rpc(ctx)
			defer cancel()
			if g, err := b.client.Get(rctx, b.queuePrefix(req.Key), clientv3.WithFirstCreate()...); err == nil && len(g.Kvs) > 0 {
				peeked <- g.Kvs[0]
			}
		})
	}
	e, first, head, start, err := b.enqueue(ctx, req, peek)
	if err != nil {
		if ctx.Err() != nil && peeked != nil {
			select {
			case holder := <-peeked:
				return driver.Grant{}, b.notAcquired(req.Key, holder, errors.Join(err, context.Cause(ctx)))
			default:
			}
		}
		return driver.Grant{}, err
	}
	if first {
		return e.grant(start), nil
	}
	w := &waiter{e: e, head: head, lastOK: sent}
	start, err = w.wait(ctx)
	if err != nil {
		if !errors.Is(err, errWaiterLeaseExpired) {
			e.abandon()
		}
		if errors.Is(err, errWaitEnded) {
			return driver.Grant{}, b.notAcquired(req.Key, w.head, context.Cause(ctx))
		}
		return driver.Grant{}, err
	}
	return e.grant(start), nil
}
