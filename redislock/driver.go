package redislock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/background"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// backend is the driver the Locker's Engine runs: one Redis deployment
// speaking the protocol of package redisproto.
type backend struct {
	node    *redisproto.Node
	waiters redisproto.Waiters
	// unsafeEviction: WithUnsafeEviction (else Try refuses a server that
	// may evict keys).
	unsafeEviction bool
}

var (
	_ driver.Driver       = (*backend)(nil)
	_ driver.Aborter      = (*backend)(nil)
	_ driver.Leaver       = (*backend)(nil)
	_ driver.Watcher      = (*backend)(nil)
	_ driver.BatchRenewer = (*backend)(nil)
	_ driver.WaitIDer     = (*subscription)(nil)
)

// Spec implements driver.Driver: exclusive, shared and limited locks.
func (b *backend) Spec() driver.Spec {
	return driver.Spec{Name: "redis", MinTTL: MinTTL, Shared: true, Limited: true}
}

// Try implements driver.Driver: one acquire script (acquire.lua for an
// exclusive request, acquire_group.lua for a shared or limited one). A
// held key (or one reserved for a woken waiter) is a
// *dlock.NotAcquiredError naming the holders; a failed request is returned
// as is, and the Engine aborts it.
func (b *backend) Try(ctx context.Context, req *driver.Request) (driver.Grant, error) {
	meta, err := redisproto.EncodeMetadata(req.Metadata)
	if err != nil {
		return driver.Grant{}, err
	}
	if err := checkEviction(ctx, b.node, b.unsafeEviction); err != nil {
		return driver.Grant{}, err
	}
	defer b.waiters.Begin(req.WaitID)() // may queue the waiter
	group := req.Mode != driver.Exclusive
	var o redisproto.Outcome
	if group {
		limit := 0
		if req.Mode == driver.Limited {
			limit = req.Limit
		}
		o, err = b.node.AcquireGroup(ctx, req.Key, req.Owner, req.TTL, meta, req.WaitID, limit)
	} else {
		o, err = b.node.Acquire(ctx, req.Key, req.Owner, req.TTL, meta, req.WaitID, req.Waiter)
	}
	var ae *redisproto.AckError
	if err != nil && o.Granted && errors.As(err, &ae) {
		return driver.Grant{}, b.rollback(ctx, req, o.Token, group, ae)
	}
	if err != nil {
		return driver.Grant{}, requestError("acquire", req.Key, err)
	}
	if o.Granted {
		return driver.Grant{Lease: &lease{b: b, key: req.Key, owner: req.Owner, token: o.Token, group: group}, Token: o.Token}, nil
	}
	if o.LimitMismatch > 0 {
		return driver.Grant{}, fmt.Errorf("%w: redis key %q is held as a semaphore of %d permits, not %d",
			dlock.ErrLimitMismatch, req.Key, o.LimitMismatch, req.Limit)
	}
	na := &dlock.NotAcquiredError{Key: req.Key}
	switch {
	case o.Group != "":
		for _, h := range o.Holders {
			na.Holders = append(na.Holders, dlock.Holder{
				Owner: h.Owner, Token: h.Token, Metadata: h.Metadata, TTL: h.TTL, Mode: groupMode(o.Group),
			})
		}
	default:
		na.Holders = []dlock.Holder{{
			Owner:    o.Holder.Owner,
			Token:    o.Holder.Token,
			Metadata: o.Holder.Metadata,
			TTL:      o.PTTL,
			Mode:     dlock.Exclusive,
		}}
	}
	switch {
	case o.WriterWaiting:
		na.Cause = errWriterWaiting
	case o.ReservedFor != "":
		na.Cause = reservedError(o.ReservedFor)
	}
	return driver.Grant{}, na
}

// rollback releases a grant fewer replicas than asked acknowledged (ae),
// synchronously, on the attempt's ctx. Rolled back, the attempt left
// nothing behind: the *ReplicationError wraps dlock.ErrTransient, and a
// blocking Acquire tries again after a backoff step. Otherwise it does
// not, and the core undoes the attempt in the background (Abort). The
// error says how many replicas are connected when fewer than asked for
// are; then, for an attempt without a deadline, which could otherwise
// wait for ever without a word, it wraps dlock.ErrUnavailable instead of
// ErrTransient, and a blocking Acquire returns it.
func (b *backend) rollback(ctx context.Context, req *driver.Request, token uint64, group bool, ae *redisproto.AckError) error {
	re := replicationError(req.Key, "acquire", ae)
	l := &lease{b: b, key: req.Key, owner: req.Owner, token: token, group: group}
	if err := l.Release(ctx); err != nil {
		re.rollbackErr = err
	} else {
		re.RolledBack = true
	}
	if ae.Err == nil && ae.Got < ae.Want {
		if n, err := redisproto.ConnectedReplicas(ctx, b.node.Client); err == nil && n < ae.Want {
			re.Connected = n
			// A caller with a deadline waits for replicas to come back
			// (a restart, a resync) until it; one without would wait
			// for ever without a word.
			_, re.unbounded = ctx.Deadline()
			re.unbounded = !re.unbounded
		}
	}
	return re
}

// requestError is the error of a request (op) on key that failed: it
// wraps dlock.ErrUnavailable when the server could not be reached or
// dropped the connection (refused, reset), the client's error kept.
func requestError(op, key string, err error) error {
	err = fmt.Errorf("dlock: redis %s %q: %w", op, key, err)
	if driver.Unreachable(err) {
		return dlock.Unavailable(err)
	}
	return err
}

// errWriterWaiting explains a shared request refused for a waiting writer.
var errWriterWaiting = errors.New("an exclusive request is waiting for it (writer preference: new shared holders wait until it is granted, gives up or its registration expires)")

// groupMode is the dlock.Mode of a group's holders.
func groupMode(g string) dlock.Mode {
	if g == redisproto.GroupLimited {
		return dlock.Limited
	}
	return dlock.Shared
}

// Leave implements driver.Leaver: withdraw a waiting writer's
// registration, so that readers kept out for it may enter at once.
func (b *backend) Leave(ctx context.Context, key, waiter string) error {
	if waiter == "" {
		return nil
	}
	return b.node.Leave(ctx, key, waiter)
}

// reservedError explains a NotAcquiredError for a key that nobody holds
// but that a release reserved for the waiter it woke.
func reservedError(id string) error {
	return fmt.Errorf("nobody holds it: the last release reserved it for waiter %s, which it woke (a hand-over in progress)", id)
}

// Abort implements driver.Aborter: delete the lease if the lost reply had
// granted it.
func (b *backend) Abort(ctx context.Context, req *driver.Request) error {
	return (&lease{b: b, key: req.Key, owner: req.Owner, group: req.Mode != driver.Exclusive}).Release(ctx)
}

// Watch implements driver.Watcher: the waiter listens on a channel of its
// own; its failed attempts queue it, and each release wakes the first
// queued waiter still listening, so one waiter retries, not all. Closing
// the subscription (Acquire returned) removes the waiter from the queue in
// the background, once none of its attempts is in flight.
func (b *backend) Watch(ctx context.Context, key string) (driver.Subscription, error) {
	id := dlock.NewOwner()[:16]
	s, err := b.node.Watch(ctx, key, id)
	if err != nil {
		return nil, err
	}
	return &subscription{Subscription: s, w: b.waiters.Add(key, id, b.node), id: id}, nil
}

// subscription is a waiter's: driver.Subscription and driver.WaitIDer.
type subscription struct {
	*redisproto.Subscription
	w  *redisproto.Waiter
	id string
}

// WaitID implements driver.WaitIDer.
func (s *subscription) WaitID() string { return s.id }

// Close ends the subscription and dequeues the waiter; it never waits on
// the network.
func (s *subscription) Close() {
	s.Subscription.Close()
	s.w.Leave()
}

// RefreshBatch implements driver.BatchRenewer: one pipeline of
// compare-and-pexpire scripts per server (on a Cluster, per master, the
// masters concurrently), each renewal reported as soon as its server
// answered. It returns when all are reported or ctx is done, whichever
// comes first: a hung server holds up neither the other servers' renewals
// nor the watchdog (the pipelines left behind end with the client's
// timeouts; their results are dropped).
func (b *backend) RefreshBatch(ctx context.Context, rs []driver.Renewal, done func(int, error)) {
	batch := make([]redisproto.Renewal, len(rs))
	leases := make([]*lease, len(rs))
	for i, r := range rs {
		l := r.Lease.(*lease)
		leases[i] = l
		batch[i] = redisproto.Renewal{Key: l.key, Owner: l.owner, TTL: r.TTL, Group: l.group}
	}
	var (
		mu     sync.Mutex
		closed bool
		left   = len(rs)
		all    = make(chan struct{})
	)
	if left == 0 {
		return
	}
	report := func(i int, held bool, err error) {
		mu.Lock()
		defer mu.Unlock()
		if closed {
			return // RefreshBatch returned: too late
		}
		done(i, leases[i].result("refresh", held, err))
		if left--; left == 0 {
			close(all)
		}
	}
	background.Go(func() { b.node.RefreshBatch(ctx, batch, report) })
	select {
	case <-all:
	case <-ctx.Done():
	}
	mu.Lock()
	closed = true
	mu.Unlock()
}

// lease is one holder's lease: driver.Lease.
type lease struct {
	b          *backend
	key, owner string
	token      uint64 // 0 when unknown (Abort)
	group      bool   // a shared or limited holder's
}

func (l *lease) result(op string, held bool, err error) error {
	var ae *redisproto.AckError
	switch {
	case err != nil && errors.As(err, &ae):
		// Held on the primary, but the extension does not count.
		return replicationError(l.key, op, ae)
	case err != nil:
		return requestError(op, l.key, err)
	case !held:
		return fmt.Errorf("%w: redis key %s no longer holds owner %s", dlock.ErrNotHeld, l.b.node.LockKey(l.key), l.owner)
	}
	return nil
}

// Refresh implements driver.Lease (compare-and-pexpire).
func (l *lease) Refresh(ctx context.Context, ttl time.Duration) error {
	if l.group {
		held, err := l.b.node.RefreshGroup(ctx, l.key, l.owner, ttl)
		return l.result("refresh", held, err)
	}
	held, err := l.b.node.Refresh(ctx, l.key, l.owner, ttl)
	return l.result("refresh", held, err)
}

// Release implements driver.Lease (compare-and-replace with the release
// marker, then publish). A release that already took effect (a retry
// after a lost reply or an error) succeeds again.
func (l *lease) Release(ctx context.Context) error {
	if l.group {
		held, err := l.b.node.ReleaseGroup(ctx, l.key, l.owner, l.token, FenceRetention)
		return l.result("release", held, err)
	}
	held, err := l.b.node.Release(ctx, l.key, l.owner, l.token, FenceRetention)
	return l.result("release", held, err)
}

var _ driver.LossNotifier = (*lease)(nil)

// breakCheckTimeout bounds the read a break notice triggers.
const breakCheckTimeout = 5 * time.Second

// breakListenDelay is how long a lock is held before it listens for break
// notices. Most locks are held for less: they cost no subscription at
// all, and a break of one is found by its release or renewal. A lock
// held longer listens, and reads its key once when the SUBSCRIBE is
// confirmed, so a break at any time reaches it within about this delay
// plus a round trip (not at its next renewal, up to TTL/3 later).
const breakListenDelay = 100 * time.Millisecond

// Bind implements driver.LossNotifier: once the lock has been held for
// breakListenDelay, the lease listens on its key's break channel (the
// acquisition never waits for the SUBSCRIBE), and on each notice reads
// the key once; when the key no longer names this owner the Lock is lost
// at once (LossBackend, wrapping dlock.ErrNotHeld), not at its next
// renewal. Once the SUBSCRIBE is confirmed the key is read once too,
// which covers a break before it; when Redis does not confirm it within
// the hub's bound (a stalled link), a break before it took effect is
// found by the next renewal. stop cancels the listening without waiting
// on the network.
func (l *lease) Bind(lose func(cause error)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	// Not background work: it lasts as long as the lock (or the client).
	t := time.AfterFunc(breakListenDelay, func() { go l.listenBreaks(ctx, lose) })
	return func() {
		t.Stop()
		cancel()
	}
}

// listenBreaks is Bind's listener, until ctx ends or the lock is lost.
func (l *lease) listenBreaks(ctx context.Context, lose func(cause error)) {
	ch := make(chan struct{}, 1)
	sub, err := l.b.node.WatchBreaks(ctx, l.key, ch)
	if err != nil {
		return // unwatched, or the server is unreachable: renewals report
	}
	defer sub.Close()
	// A break before the SUBSCRIBE published before anyone listened:
	// check once now that the notices are heard.
	select {
	case ch <- struct{}{}:
	default: // a notice is already pending
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-ch:
		}
		cctx, ccancel := context.WithTimeout(ctx, breakCheckTimeout)
		held, err, abandoned := redisproto.Await(cctx, func(c context.Context) (bool, error) {
			return l.b.node.Holds(c, l.key, l.owner, l.group)
		})
		ccancel()
		if err == nil && !abandoned && !held {
			lose(fmt.Errorf("%w: redis key %s no longer holds owner %s (broken)", dlock.ErrNotHeld, l.b.node.LockKey(l.key), l.owner))
			return
		}
		if errors.Is(err, redis.ErrClosed) {
			return // the client is closed: no more notices, nor checks
		}
	}
}
