// Waiting in the queue: a waiter watches only the entry just ahead of its
// own, keeps its lease alive and probes etcd until it is first.

package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
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
	e      *entry
	head   *mvccpb.KeyValue // the holder, as last read
	lastOK time.Time        // when the last request that etcd answered was sent
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

// wait blocks until no entry with a smaller create revision is left, and
// returns the start from which the lock counts.
func (w *waiter) wait(ctx context.Context) (time.Time, error) {
	e, b := w.e, w.e.b
	pfx := b.queuePrefix(e.key)
	for {
		if ctx.Err() != nil {
			return time.Time{}, w.ended(ctx, nil)
		}
		// One round trip: the head, the nearest entry ahead of ours, ours.
		sent := time.Now()
		rctx, cancel := b.rpc(ctx)
		resp, err := b.client.Txn(rctx).Then(
			clientv3.OpGet(pfx, clientv3.WithFirstCreate()...),
			clientv3.OpGet(pfx, append(clientv3.WithLastCreate(), clientv3.WithMaxCreateRev(e.rev-1))...),
			clientv3.OpGet(e.myKey, clientv3.WithKeysOnly()),
		).Commit()
		cancel()
		if err != nil {
			return time.Time{}, w.failed(ctx, "reading the queue", err)
		}
		w.lastOK = sent
		if mine := resp.Responses[2].GetResponseRange().Kvs; len(mine) == 0 || mine[0].CreateRevision != e.rev {
			b.gone(e)
			return time.Time{}, errWaiterLeaseExpired
		}
		if head := resp.Responses[0].GetResponseRange().Kvs; len(head) > 0 {
			w.head = head[0]
		}
		ahead := resp.Responses[1].GetResponseRange().Kvs
		if len(ahead) == 0 {
			break
		}
		if err := w.waitDelete(ctx, ahead[0]); err != nil {
			return time.Time{}, err
		}
	}
	// First in the queue with our entry intact (read in the same
	// transaction): the lock counts from a fresh enough renewal of the lease.
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
			return time.Time{}, w.failed(ctx, "keeping the lease alive", err)
		}
	}
	return start, nil
}

// waitDelete waits until pred is deleted, keeping the lease alive and
// checking every waitProbe that etcd answers and that pred, the holder and
// our own entry are still there. The watch starts at the current
// revision: a watch from a past revision is served by etcd's catch-up
// loop, which runs only every 100ms (the tail concurrency.Mutex waiters
// see). A delete between our read and the watch's start is caught by
// reading pred again once the watch exists.
func (w *waiter) waitDelete(ctx context.Context, pred *mvccpb.KeyValue) error {
	b := w.e.b
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wch := b.client.Watch(wctx, string(pred.Key), clientv3.WithCreatedNotify())
	probe := time.NewTimer(waitProbe)
	defer probe.Stop()
	for {
		select {
		case wr, ok := <-wch:
			if ctx.Err() != nil {
				return w.ended(ctx, nil)
			}
			if !ok || wr.Err() != nil {
				return nil // re-read the queue (and watch again)
			}
			if wr.Created {
				sent := time.Now()
				rctx, rcancel := b.rpc(ctx)
				g, err := b.client.Get(rctx, string(pred.Key), clientv3.WithKeysOnly())
				rcancel()
				if err != nil {
					return w.failed(ctx, "reading the entry ahead", err)
				}
				w.lastOK = sent
				if len(g.Kvs) == 0 || g.Kvs[0].CreateRevision != pred.CreateRevision {
					return nil // already gone
				}
			}
			for _, ev := range wr.Events {
				if ev.Type == mvccpb.DELETE {
					return nil
				}
			}
		case <-probe.C:
			if err := w.keepAliveDue(ctx); err != nil {
				return err
			}
			// A stale entry of ours ahead of us (a release or a wait that
			// could not delete it) would hold us up until its lease expires.
			b.sweepKey(ctx, w.e.key)
			gone, err := w.probe(ctx, pred)
			if err != nil || gone {
				return err
			}
			probe.Reset(waitProbe)
		case <-ctx.Done():
			return w.ended(ctx, nil)
		}
	}
}

// probe checks, in one round trip of point reads, that pred and our entry
// are still there and whether the holder changed (re-reading the head only
// then). It reports whether pred is gone.
func (w *waiter) probe(ctx context.Context, pred *mvccpb.KeyValue) (bool, error) {
	e, b := w.e, w.e.b
	ops := []clientv3.Op{
		clientv3.OpGet(string(pred.Key), clientv3.WithKeysOnly()),
		clientv3.OpGet(e.myKey, clientv3.WithKeysOnly()),
	}
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
		}
	}
	p := resp.Responses[0].GetResponseRange().Kvs
	return len(p) == 0 || p[0].CreateRevision != pred.CreateRevision, nil
}
