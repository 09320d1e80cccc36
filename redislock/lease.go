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
