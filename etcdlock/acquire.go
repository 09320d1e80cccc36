// Acquiring: Try (driver.Driver) and Queue (driver.Queuer) put an entry in
// a key's queue; the holder is the entry with the lowest create revision.
// Abort (driver.Aborter) removes the entry of an attempt whose outcome is
// unknown. The wait in the queue is in wait.go.

package etcdlock

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/background"
)

// serverTimeoutTransient marks an attempt that etcd itself gave up on
// (its request timeout: a proposal not committed in time, a leader change
// or loss, on a slow disk or a cluster without quorum for a moment) as
// dlock.ErrTransient, so that Acquire tries again while its context
// allows instead of failing at once. Nothing is left behind: the entry
// of an attempt whose outcome is unknown is an orphan, deleted by value,
// and its session retired (unknown). Other errors pass unchanged.
func serverTimeoutTransient(err error) error {
	if err == nil || errors.Is(err, dlock.ErrTransient) {
		return err
	}
	for _, t := range []error{rpctypes.ErrTimeout, rpctypes.ErrTimeoutDueToLeaderFail, rpctypes.ErrTimeoutDueToConnectionLost, rpctypes.ErrLeaderChanged, rpctypes.ErrNoLeader} {
		if errors.Is(err, t) {
			return fmt.Errorf("%w: %w", dlock.ErrTransient, err)
		}
	}
	return err
}

// unreachable marks an error of a request that could not reach etcd, or
// whose connection dropped under it (a refused or reset connection, which
// gRPC reports with the status code Unavailable), or that got no answer
// within its request timeout (DeadlineExceeded), as dlock.ErrUnavailable,
// the client's error kept in the chain. Other errors pass unchanged.
func unreachable(err error) error {
	// DeadlineExceeded: the request's own timeout (WithRequestTimeout)
	// passed without an answer.
	if driver.Unreachable(err) || status.Code(err) == codes.Unavailable || status.Code(err) == codes.DeadlineExceeded {
		return dlock.Unavailable(err)
	}
	return err
}

// notAcquired is the error of an attempt that found the key held by
// holders (none if unknown). A holder that is not dlock's (etcdctl, a
// concurrency.Mutex) has no owner id: it is named by its lease.
func (b *backend) notAcquired(key string, holders []*mvccpb.KeyValue, cause error) *dlock.NotAcquiredError {
	return &dlock.NotAcquiredError{Key: key, Cause: cause, Holders: holdersList(holders)}
}

// holderOf describes the queue entry kv as a holder (TTL unknown: zero).
func holderOf(kv *mvccpb.KeyValue) dlock.Holder {
	v := parseValue(kv.Value)
	m, _ := modeOf(kv)
	h := dlock.Holder{Owner: v.Owner, Token: uint64(kv.CreateRevision), Metadata: v.Metadata, Mode: dlock.Mode(m)}
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

// inOrder are the options of a read of a whole queue, oldest entry first.
func inOrder(opts ...clientv3.OpOption) []clientv3.OpOption {
	return append([]clientv3.OpOption{clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend)}, opts...)
}

// Try implements driver.Driver. An exclusive attempt is one transaction:
// put this attempt's entry only if the queue is empty, else read its head
// (the holder). A shared or limited attempt reads the whole queue instead
// of its head and, if its entry would hold behind the entries read (see
// blockers), joins the queue as a queued Acquire does (put the entry and
// read the entries ahead of it in one transaction) and holds if the
// entries ahead of it let it. Only an entry that conflicts with it and
// arrived between the two transactions can refuse it then: its entry is
// removed again (in the background). Otherwise nothing is left behind
// when the key is held: in particular a shared attempt behind a writer
// already queued is refused without ever being in the queue.
//
// (The second transaction does not put the entry only if no entry was
// created since the read, reading again otherwise: that would refuse
// readers that arrive together with other readers, each round letting
// only one of them in.)
func (b *backend) Try(ctx context.Context, req *driver.Request) (g driver.Grant, err error) {
	defer func() { err = unreachable(serverTimeoutTransient(err)) }()
	b.sweepKey(ctx, req.Key)
	pfx := b.queuePrefix(req.Key)
	shares := req.Mode != driver.Exclusive
	read := clientv3.OpGet(pfx, clientv3.WithFirstCreate()...)
	if shares {
		read = clientv3.OpGet(pfx, inOrder()...)
	}
	cmp := clientv3.Compare(clientv3.CreateRevision(pfx), "=", 0).WithPrefix()
	var (
		e           *entry
		start       time.Time
		leaseRenewd bool
	)
	for {
		if e == nil {
			var err error
			if e, start, err = b.newEntry(ctx, req, nil); err != nil {
				return driver.Grant{}, err
			}
		}
		rctx, cancel := b.rpc(ctx)
		resp, err := b.client.Txn(rctx).
			If(cmp).
			Then(clientv3.OpPut(e.myKey, e.val, clientv3.WithLease(e.s.id))).
			Else(read).
			Commit()
		cancel()
		if err != nil {
			if !leaseRenewd && b.leaseGone(e, err) {
				leaseRenewd, e = true, nil
				continue
			}
			b.unknown(e)
			return driver.Grant{}, fmt.Errorf("dlock: etcd acquire %q: %w", req.Key, err)
		}
		if resp.Succeeded {
			e.rev = resp.Header.Revision
			return e.grant(start), nil
		}
		q := resp.Responses[0].GetResponseRange().Kvs
		if !shares {
			b.gone(e) // nothing was put
			return driver.Grant{}, b.notAcquired(req.Key, b.holdersBehind(ctx, pfx, q), nil)
		}
		for _, kv := range q {
			if string(kv.Key) == e.myKey {
				// An entry of this lease for the key that we had no record
				// of (a create that took effect late): never adopt it.
				b.stale(ctx, e, kv)
				return driver.Grant{}, fmt.Errorf("%w: etcd acquire %q: a stale entry of this client was in the way", dlock.ErrTransient, req.Key)
			}
		}
		b.gone(e) // nothing was put; the join takes its own slot
		if err := limitMismatch(req.Key, req, first(q)); err != nil {
			return driver.Grant{}, err
		}
		if blockers(q, req.Mode, req.Limit) != nil {
			return driver.Grant{}, b.notAcquired(req.Key, holdersOf(q), nil)
		}
		return b.join(ctx, req)
	}
}

// join puts a shared or limited TryAcquire's entry in the queue, which the
// read before showed it could join, and grants it if the entries ahead of
// it let it hold; if not (a conflicting entry arrived since the read), it
// removes the entry again and refuses.
func (b *backend) join(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	e, ahead, start, err := b.enqueue(ctx, req, nil)
	if err != nil {
		return driver.Grant{}, err
	}
	if err := limitMismatch(req.Key, req, first(ahead)); err != nil {
		e.abandon()
		return driver.Grant{}, err
	}
	if blockers(ahead, req.Mode, req.Limit) != nil {
		e.abandon()
		return driver.Grant{}, b.notAcquired(req.Key, holdersOf(ahead), nil)
	}
	return e.grant(start), nil
}

// first returns q's first entry, nil if q is empty.
func first(q []*mvccpb.KeyValue) *mvccpb.KeyValue {
	if len(q) == 0 {
		return nil
	}
	return q[0]
}

// holdersBehind returns the holders of a queue whose head (only) an
// exclusive attempt read: that head alone if it is exclusive, else all
// the holders, read from the queue (best effort: the head alone if that
// read fails).
func (b *backend) holdersBehind(ctx context.Context, pfx string, head []*mvccpb.KeyValue) []*mvccpb.KeyValue {
	if len(head) == 0 {
		return nil
	}
	if m, _ := modeOf(head[0]); m == driver.Exclusive {
		return head[:1]
	}
	rctx, cancel := b.rpc(ctx)
	defer cancel()
	g, err := b.client.Get(rctx, pfx, inOrder()...)
	if err != nil || len(g.Kvs) == 0 {
		return head[:1]
	}
	return holdersOf(g.Kvs)
}

// stale handles an entry kv of e's lease for e's key that we had no record
// of (a create that took effect after we gave up on it): e takes its
// place as an orphan (deleted by create revision), and the key is swept.
func (b *backend) stale(ctx context.Context, e *entry, kv *mvccpb.KeyValue) {
	b.mu.Lock()
	if kv != nil {
		e.rev, e.val = kv.CreateRevision, string(kv.Value)
	}
	r := b.orphanLocked(e, false)
	b.mu.Unlock()
	if r {
		b.revoke(e.s)
	}
	b.sweepKey(ctx, e.key)
}

// enqueue puts this attempt's entry in the queue and returns the entries
// ahead of it, oldest first: for an exclusive attempt only the first (none
// when it is first), for a shared or limited one all of them.
func (b *backend) enqueue(ctx context.Context, req *driver.Request, peek func()) (*entry, []*mvccpb.KeyValue, time.Time, error) {
	pfx := b.queuePrefix(req.Key)
	read := clientv3.OpGet(pfx, clientv3.WithFirstCreate()...)
	if req.Mode != driver.Exclusive {
		read = clientv3.OpGet(pfx, inOrder()...)
	}
	for attempt := 0; ; attempt++ {
		e, start, err := b.newEntry(ctx, req, peek)
		peek = nil
		if err != nil {
			return nil, nil, time.Time{}, err
		}
		rctx, cancel := b.rpc(ctx)
		resp, err := b.client.Txn(rctx).
			If(clientv3.Compare(clientv3.CreateRevision(e.myKey), "=", 0)).
			Then(clientv3.OpPut(e.myKey, e.val, clientv3.WithLease(e.s.id)), read).
			Else(clientv3.OpGet(e.myKey)).
			Commit()
		cancel()
		if err != nil {
			if attempt == 0 && b.leaseGone(e, err) {
				continue
			}
			b.unknown(e)
			return nil, nil, time.Time{}, fmt.Errorf("dlock: etcd acquire %q: %w", req.Key, err)
		}
		if !resp.Succeeded {
			// An entry of this lease for the key that we had no record of
			// (a create that took effect after we gave up on it). Never
			// adopt it: delete it, and take another lease.
			b.stale(ctx, e, first(resp.Responses[0].GetResponseRange().Kvs))
			if attempt < 2 {
				continue
			}
			return nil, nil, time.Time{}, fmt.Errorf("%w: etcd acquire %q: a stale entry of this client was in the way", dlock.ErrTransient, req.Key)
		}
		e.rev = resp.Header.Revision
		q := resp.Responses[1].GetResponseRange().Kvs
		ahead := q[:0:0]
		for _, kv := range q {
			if kv.CreateRevision < e.rev {
				ahead = append(ahead, kv)
			}
		}
		return e, ahead, start, nil
	}
}

// Queue implements driver.Queuer: wait in key's FIFO queue, watching only
// the entries whose deletion can let this one hold (see blockers: for an
// exclusive or shared entry one entry, no herd), keeping the lease alive
// meanwhile. When ctx ends while etcd keeps answering, it returns at once
// a *dlock.NotAcquiredError naming the holders (the queue entry is removed
// in the background); when a request fails, or etcd stopped answering, it
// returns that error. A limited attempt that finds the key held by
// holders limited to another number (at once or while it waits) returns
// an error wrapping dlock.ErrLimitMismatch and removes its entry.
func (b *backend) Queue(ctx context.Context, req *driver.Request) (g driver.Grant, err error) {
	defer func() { err = unreachable(serverTimeoutTransient(err)) }()
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
	e, ahead, start, err := b.enqueue(ctx, req, peek)
	if err != nil {
		if ctx.Err() != nil && peeked != nil {
			select {
			case holder := <-peeked:
				return driver.Grant{}, b.notAcquired(req.Key, []*mvccpb.KeyValue{holder}, errors.Join(err, context.Cause(ctx)))
			default:
			}
		}
		return driver.Grant{}, err
	}
	if len(ahead) == 0 {
		return e.grant(start), nil
	}
	w := &waiter{e: e, mode: req.Mode, limit: req.Limit, head: ahead[0], lastOK: sent}
	var preds []*mvccpb.KeyValue
	if w.shares() {
		if err := limitMismatch(req.Key, req, ahead[0]); err != nil {
			e.abandon()
			return driver.Grant{}, err
		}
		if preds = blockers(ahead, req.Mode, req.Limit); preds == nil {
			return e.grant(start), nil
		}
		w.holders = holdersOf(ahead)
	}
	start, err = w.wait(ctx, preds)
	if err != nil {
		if errors.Is(err, errWaiterLeaseExpired) {
			// Its entry went with its lease: queue again, at the back.
			return driver.Grant{}, fmt.Errorf("%w: etcd acquire %q: %w", dlock.ErrTransient, req.Key, err)
		}
		e.abandon()
		if errors.Is(err, errWaitEnded) {
			return driver.Grant{}, b.notAcquired(req.Key, w.seen(), context.Cause(ctx))
		}
		return driver.Grant{}, err
	}
	return e.grant(start), nil
}

// Abort implements driver.Aborter: remove this owner's queue entry if the
// request whose outcome is unknown had created it. The entry is deleted by
// its exact value or revision, so another owner's entry is never touched.
func (b *backend) Abort(ctx context.Context, req *driver.Request) error {
	b.mu.Lock()
	var mine []*entry
	for e := range b.orphans {
		if e.owner == req.Owner {
			mine = append(mine, e)
		}
	}
	b.mu.Unlock()
	if len(mine) > 0 {
		return b.sweep(ctx, mine)
	}
	// No record of it (its session was forgotten): look it up by owner.
	rctx, cancel := b.rpc(ctx)
	defer cancel()
	resp, err := b.client.Get(rctx, b.queuePrefix(req.Key), clientv3.WithPrefix())
	if err != nil {
		return err
	}
	for _, kv := range resp.Kvs {
		if parseValue(kv.Value).Owner != req.Owner {
			continue
		}
		if _, err := b.client.Txn(rctx).
			If(clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision)).
			Then(clientv3.OpDelete(string(kv.Key))).Commit(); err != nil {
			return err
		}
	}
	return nil
}
