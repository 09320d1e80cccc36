// Release notification: a waiter watches the entries whose deletion can
// let it hold (one entry for an exclusive or shared waiter, no herd), and
// wakes when one of them is deleted.

package etcdlock

import (
	"context"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// waitDelete waits until one of preds is deleted, keeping the lease alive
// and checking every waitProbe that etcd answers and that preds, the
// holder and our own entry are still there. Each entry is watched by its
// key, up to maxKeyWatches of them (the entries just ahead of a limited
// waiter); more by one watch on the queue's directory, whose events other
// than their deletion are ignored. The watch starts at the current
// revision: a watch from a past revision is served by etcd's catch-up
// loop, which runs only every 100ms (the tail concurrency.Mutex waiters
// see). A delete between our read and the watch's start is caught by
// reading preds again once the watch exists.
func (w *waiter) waitDelete(ctx context.Context, preds []*mvccpb.KeyValue) error {
	b := w.e.b
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wch clientv3.WatchChan
	watched := map[string]bool{}
	created, watches := 0, 1
	switch {
	case len(preds) == 1:
		wch = b.client.Watch(wctx, string(preds[0].Key), clientv3.WithCreatedNotify())
	case len(preds) <= maxKeyWatches:
		wch, watches = b.watchKeys(wctx, preds), len(preds)
	default:
		wch = b.client.Watch(wctx, b.queuePrefix(w.e.key), clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	}
	if len(preds) > 1 {
		for _, p := range preds {
			watched[string(p.Key)] = true
		}
	}
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
				if len(preds) > 1 {
					// Once every watch is set up: was one deleted before?
					if created++; created < watches {
						continue
					}
					gone, err := w.probe(ctx, preds)
					if err != nil || gone {
						return err
					}
					continue
				}
				pred := preds[0]
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
				if ev.Type == mvccpb.DELETE && (len(preds) == 1 || watched[string(ev.Kv.Key)]) {
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
			gone, err := w.probe(ctx, preds)
			if err != nil || gone {
				return err
			}
			probe.Reset(waitProbe)
		case <-ctx.Done():
			return w.ended(ctx, nil)
		}
	}
}

// maxKeyWatches is the largest number of entries that a waiter watches
// one by one; beyond, it watches its queue's directory.
const maxKeyWatches = 16

// watchKeys watches each of preds' keys and merges their responses into
// one channel, until ctx ends. A watch that ends is reported as a
// cancelled response, so that the waiter re-reads the queue.
func (b *backend) watchKeys(ctx context.Context, preds []*mvccpb.KeyValue) clientv3.WatchChan {
	out := make(chan clientv3.WatchResponse)
	for _, p := range preds {
		wch := b.client.Watch(ctx, string(p.Key), clientv3.WithCreatedNotify())
		go func() {
			for wr := range wch {
				select {
				case out <- wr:
				case <-ctx.Done():
					return
				}
			}
			select {
			case out <- clientv3.WatchResponse{Canceled: true}:
			case <-ctx.Done():
			}
		}()
	}
	return out
}
