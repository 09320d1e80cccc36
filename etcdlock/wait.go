// Waiting in the queue: a waiter re-reads the queue until its entry holds,
// meanwhile waiting for the deletion of the entries ahead that block it
// (watch.go), keeping its lease alive and probing etcd every waitProbe.

package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

const (
	// waitProbe is how often a waiter checks its place in the queue (and
	// so that etcd answers) while it watches the entry ahead of it.
	waitProbe = 250 * time.Millisecond
	// waitRecency: a wait whose context ends reports the holder it waits
	// behind (ErrNotAcquired) only if etcd confirmed that holder this
	// recently; otherwise it reports that etcd did not answer.
	waitRecency = time.Second
)

// errWaitEnded ends a wait whose context ended while etcd kept answering:
// Queue reports the holder it waited behind.
var errWaitEnded = errors.New("dlock: etcd wait ended by its context")

// errWaiterLeaseExpired ends a wait whose own lease expired.
var errWaiterLeaseExpired = errors.New("dlock: etcd lease of a waiting lock expired; its place in the queue is gone")

// waiter is one entry waiting for its turn.
type waiter struct {
	e       *entry
	mode    driver.Mode
	limit   int
	head    *mvccpb.KeyValue   // the holder, as last read
	holders []*mvccpb.KeyValue // a shared or limited waiter's holders, as last read with the queue
	lastOK  time.Time          // when the last request that etcd answered was sent
}

// shares reports whether the waiter is shared or limited: it reads the
// whole queue ahead of it, and may wait for several entries.
func (w *waiter) shares() bool { return w.mode != driver.Exclusive }

// seen returns the holders last read: those read with the queue if the
// head has not changed since, else the head.
func (w *waiter) seen() []*mvccpb.KeyValue {
	if w.head == nil {
		return nil
	}
	if len(w.holders) > 0 && sameEntry(w.holders[0], w.head) {
		return w.holders
	}
	return []*mvccpb.KeyValue{w.head}
}

func sameEntry(a, b *mvccpb.KeyValue) bool {
	return string(a.Key) == string(b.Key) && a.CreateRevision == b.CreateRevision
}

// ended is the outcome of a wait whose context ended (err: the request in
// flight then, if any): the holder if etcd answered recently, else that
// etcd did not answer.
func (w *waiter) ended(ctx context.Context, err error) error {
	if since := time.Since(w.lastOK); since >= waitRecency {
		if err == nil {
			err = context.Cause(ctx)
		}
		return fmt.Errorf("dlock: etcd acquire %q: no answer from etcd in the last %v of the wait: %w", w.e.key, since.Round(time.Millisecond), err)
	}
	return errWaitEnded
}

// failed is the outcome of a request of the wait that returned err.
func (w *waiter) failed(ctx context.Context, what string, err error) error {
	if ctx.Err() != nil {
		return w.ended(ctx, err)
	}
	return fmt.Errorf("dlock: etcd acquire %q: %s: %w", w.e.key, what, err)
}

// keepAliveDue renews the lease when a third of its TTL has passed since
// its last renewal.
func (w *waiter) keepAliveDue(ctx context.Context) error {
	s := w.e.s
	w.e.b.mu.Lock()
	due := time.Since(s.validFrom) >= s.ttl/3
	w.e.b.mu.Unlock()
	if !due {
		return nil
	}
	start := time.Now()
	if err := w.e.b.keepAlive(ctx, s); err != nil {
		if errors.Is(err, dlock.ErrNotHeld) {
			return fmt.Errorf("%w: %v", errWaiterLeaseExpired, err)
		}
		return w.failed(ctx, "keeping the lease alive", err)
	}
	w.lastOK = start
	w.e.b.sweepSession(ctx, s)
	return nil
}

// wait blocks until the entry holds: for an exclusive entry, until no
// entry with a smaller create revision is left; for a shared or limited
// one, until blockers finds none (starting with preds, the blockers of
// the entry as it was put, if not nil). It returns the start from which
// the lock counts.
func (w *waiter) wait(ctx context.Context, preds []*mvccpb.KeyValue) (time.Time, error) {
	e, b := w.e, w.e.b
	pfx := b.queuePrefix(e.key)
	for {
		if preds != nil {
			if err := w.waitDelete(ctx, preds); err != nil {
				return time.Time{}, err
			}
		}
		if ctx.Err() != nil {
			return time.Time{}, w.ended(ctx, nil)
		}
		// One round trip: the head, the nearest entry ahead of ours, ours;
		// or, for a shared or limited entry, every entry ahead and ours.
		ops := []clientv3.Op{
			clientv3.OpGet(pfx, clientv3.WithFirstCreate()...),
			clientv3.OpGet(pfx, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(e.rev-1))...),
		}
		if w.shares() {
			ops = []clientv3.Op{clientv3.OpGet(pfx, inOrder(clientv3.WithMaxCreateRev(e.rev-1))...)}
		}
		ops = append(ops, clientv3.OpGet(e.myKey, clientv3.WithKeysOnly()))
		sent := time.Now()
		rctx, cancel := b.rpc(ctx)
		resp, err := b.client.Txn(rctx).Then(ops...).Commit()
		cancel()
		if err != nil {
			return time.Time{}, w.failed(ctx, "reading the queue", err)
		}
		w.lastOK = sent
		rs := resp.Responses
		if mine := rs[len(rs)-1].GetResponseRange().Kvs; len(mine) == 0 || mine[0].CreateRevision != e.rev {
			b.gone(e)
			return time.Time{}, errWaiterLeaseExpired
		}
		if w.shares() {
			ahead := rs[0].GetResponseRange().Kvs
			if len(ahead) > 0 {
				w.head, w.holders = ahead[0], holdersOf(ahead)
			}
			if err := limitMismatch(e.key, &driver.Request{Mode: w.mode, Limit: w.limit}, first(ahead)); err != nil {
				return time.Time{}, err
			}
			if preds = blockers(ahead, w.mode, w.limit); preds == nil {
				break
			}
			continue
		}
		if head := rs[0].GetResponseRange().Kvs; len(head) > 0 {
			w.head = head[0]
		}
		preds = rs[1].GetResponseRange().Kvs
		if len(preds) == 0 {
			break
		}
	}
	// Holding (first in the queue, or behind entries that share with us)
	// with our entry intact (read in the same transaction): the lock
	// counts from a fresh enough renewal of the lease.
	now := time.Now()
	b.mu.Lock()
	start, fresh := e.s.validity(now)
	b.mu.Unlock()
	if !fresh {
		start = time.Now()
		if err := b.keepAlive(ctx, e.s); err != nil {
			if errors.Is(err, dlock.ErrNotHeld) {
				return time.Time{}, fmt.Errorf("%w: %v", errWaiterLeaseExpired, err)
			}
			// Not w.failed: the entry is no longer behind a holder, so a
			// context that ended here is no "held by" (the head read last
			// may be this entry itself). The outcome is unknown.
			return time.Time{}, fmt.Errorf("dlock: etcd acquire %q: keeping the lease alive, first in the queue: %w", e.key, err)
		}
	}
	return start, nil
}

// probe checks, in one round trip, that preds and our entry are still
// there and whether the holder changed (re-reading the head only then).
// One pred is read by its key; several by a read of the keys ahead of
// ours. It reports whether one of preds is gone.
func (w *waiter) probe(ctx context.Context, preds []*mvccpb.KeyValue) (bool, error) {
	e, b := w.e, w.e.b
	predsOp := clientv3.OpGet(string(preds[0].Key), clientv3.WithKeysOnly())
	if len(preds) > 1 {
		predsOp = clientv3.OpGet(b.queuePrefix(e.key), clientv3.WithPrefix(), clientv3.WithKeysOnly(), clientv3.WithMaxCreateRev(e.rev-1))
	}
	ops := []clientv3.Op{predsOp, clientv3.OpGet(e.myKey, clientv3.WithKeysOnly())}
	withHead := append(ops, clientv3.OpGet(b.queuePrefix(e.key), clientv3.WithFirstCreate()...))
	sent := time.Now()
	rctx, cancel := b.rpc(ctx)
	txn := b.client.Txn(rctx)
	if w.head != nil {
		txn = txn.If(clientv3.Compare(clientv3.CreateRevision(string(w.head.Key)), "=", w.head.CreateRevision)).
			Then(ops...).Else(withHead...)
	} else {
		txn = txn.Then(withHead...)
	}
	resp, err := txn.Commit()
	cancel()
	if err != nil {
		return false, w.failed(ctx, "checking the queue", err)
	}
	w.lastOK = sent
	if mine := resp.Responses[1].GetResponseRange().Kvs; len(mine) == 0 || mine[0].CreateRevision != e.rev {
		b.gone(e)
		return false, errWaiterLeaseExpired
	}
	if len(resp.Responses) > 2 {
		if head := resp.Responses[2].GetResponseRange().Kvs; len(head) > 0 {
			w.head = head[0]
			// A permit waiting behind entries of another limit learns
			// here that they now hold the key.
			if err := limitMismatch(e.key, &driver.Request{Mode: w.mode, Limit: w.limit}, w.head); err != nil {
				return false, err
			}
		}
	}
	there := map[string]int64{}
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		there[string(kv.Key)] = kv.CreateRevision
	}
	for _, p := range preds {
		if rev, ok := there[string(p.Key)]; !ok || rev != p.CreateRevision {
			return true, nil
		}
	}
	return false, nil
}
