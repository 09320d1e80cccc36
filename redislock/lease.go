package redislock

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/background"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// lease is one holder's lease: driver.Lease.
type lease struct {
	b   *backend
	key string
	// owner is the holder's owner id; for a Lua-free lease (tair), its
	// whole value on the server, which its CAS and CAD compare (see
	// ownerID).
	owner string
	token uint64 // 0 when unknown (Abort)
	group bool   // a shared or limited holder's
	// alone: granted by the first attempt of its acquisition, on a free
	// key; its release tries the script for a key nobody waits for.
	alone bool
	// tair: granted by the Lua-free protocol.
	tair bool
	// gen: the Locker's break-notice count before the acquisition's
	// request was sent (see breakWatch.gen).
	gen uint64
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
		return fmt.Errorf("%w: redis key %s no longer holds owner %s", dlock.ErrNotHeld, l.b.node.LockKey(l.key), l.ownerID())
	}
	return nil
}

// Refresh implements driver.Lease (compare-and-pexpire).
func (l *lease) Refresh(ctx context.Context, ttl time.Duration) error {
	if l.tair {
		held, err := l.b.node.TairRefresh(ctx, l.key, l.owner, ttl)
		return l.result("refresh", held, err)
	}
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
	if l.tair {
		held, err := l.b.node.TairRelease(ctx, l.key, l.owner, FenceRetention)
		return l.result("release", held, err)
	}
	if l.group {
		held, err := l.b.node.ReleaseGroup(ctx, l.key, l.owner, l.token, FenceRetention)
		return l.result("release", held, err)
	}
	if l.alone {
		if ok, err := l.b.node.ReleaseFast(ctx, l.key, l.owner, FenceRetention); ok || err != nil {
			return l.result("release", ok, err)
		}
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
		if l.tair {
			batch[i].Value = l.owner
		}
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

// Bind implements driver.LossNotifier: the lease listens for break
// notices of its key from the moment it is granted, and on each notice
// its key is read (see breakChecks); when the key no longer names this
// owner the Lock is lost at once (LossBackend, wrapping dlock.ErrNotHeld),
// not at its next renewal. The notices of every key come on one pattern
// subscription per Locker (see breakWatch): a held lock costs an entry in
// a map, no subscription, timer or goroutine. Once the pattern
// subscription is confirmed every lease listening then is checked once,
// which covers a break before it, and a lease bound after any notice
// that came since its acquisition's request was sent is checked once
// (a break between its grant and its Bind); when Redis does not confirm
// the subscription (a stalled link), a break before it took effect is
// found by the next renewal. The key is read by a script, so that a
// client routing reads to replicas still asks the primary. stop ends the
// listening without waiting on the network.
func (l *lease) Bind(lose func(cause error)) (stop func()) {
	bl := &breakListener{l: l, lose: lose}
	l.b.breaks.add(bl)
	return bl.stop
}

// breakListener is one Lock's listening for break notices.
type breakListener struct {
	l    *lease
	lose func(cause error)
	// queued: the listener waits in breakChecks for its key to be read
	// (set by a notice, on the hub's reader goroutine).
	queued  atomic.Bool
	done    atomic.Bool // stopped, or lost: no more checks nor losses
	stopped atomic.Bool
}

// notice queues a read of the key, unless one is queued already. It runs
// on the hub's reader goroutine and does not block.
func (bl *breakListener) notice() {
	if !bl.done.Load() && bl.queued.CompareAndSwap(false, true) {
		bl.l.b.breakChecks.add(bl)
	}
}

func (bl *breakListener) stop() {
	if bl.stopped.Swap(true) {
		return
	}
	bl.done.Store(true)
	bl.l.b.breaks.remove(bl)
}

// breakWatch is a Locker's listening for break notices: the listeners of
// its held locks by key, and while any is there (and breakIdle after the
// last left) one pattern subscription to every break channel of the
// prefix. Breaks are rare; a notice of a key nobody here holds costs a
// map lookup.
type breakWatch struct {
	node *redisproto.Node

	mu    sync.Mutex
	byKey map[string][]*breakListener
	n     int
	sub   *redisproto.Subscription // nil while not listening
	// starting: a goroutine is opening the subscription (outside mu: the
	// hub calls notice with its own lock held, and notice takes mu).
	starting bool
	idle     *time.Timer // closes sub once nobody listened for breakIdle
	// gen counts the notices heard (keyed or not; under mu, read
	// without it by Try). A lease records it before its acquisition's
	// request is sent; a Bind that finds it changed reads its key once:
	// the notice may have been its own key's break, between its grant
	// and the moment it listened, heard by nobody.
	gen atomic.Uint64
}

// breakIdle is how long the pattern subscription outlives the last held
// lock: a Locker that takes short locks one after another keeps it.
const breakIdle = time.Minute

func (bw *breakWatch) add(bl *breakListener) {
	bw.mu.Lock()
	if bw.byKey == nil {
		bw.byKey = map[string][]*breakListener{}
	}
	bw.byKey[bl.l.key] = append(bw.byKey[bl.l.key], bl)
	bw.n++
	if bw.gen.Load() != bl.l.gen {
		bl.notice() // a break may have come before this lock listened
	}
	if bw.idle != nil {
		bw.idle.Stop()
		bw.idle = nil
	}
	start := bw.sub == nil && !bw.starting
	bw.starting = bw.starting || start
	bw.mu.Unlock()
	if start {
		sub := bw.node.ListenAllBreaks(bw.notice) // returns at once
		bw.mu.Lock()
		bw.sub, bw.starting = sub, false
		bw.mu.Unlock()
	}
}

func (bw *breakWatch) remove(bl *breakListener) {
	bw.mu.Lock()
	defer bw.mu.Unlock()
	ls := bw.byKey[bl.l.key]
	i := slices.Index(ls, bl)
	if i < 0 {
		return
	}
	if ls = slices.Delete(ls, i, i+1); len(ls) == 0 {
		delete(bw.byKey, bl.l.key)
	} else {
		bw.byKey[bl.l.key] = ls
	}
	if bw.n--; bw.n == 0 && bw.idle == nil {
		bw.idle = time.AfterFunc(breakIdle, bw.closeIdle)
	}
}

// closeIdle ends the pattern subscription if nobody listened since.
func (bw *breakWatch) closeIdle() {
	bw.mu.Lock()
	var sub *redisproto.Subscription
	if bw.n == 0 && bw.sub != nil {
		sub, bw.sub = bw.sub, nil
	}
	bw.idle = nil
	bw.mu.Unlock()
	if sub != nil {
		sub.Close() // never waits on the network
	}
}

// notice is the pattern subscription's: a break of key, or ("") a
// confirmation or a lost connection, which every listener checks.
func (bw *breakWatch) notice(key string) {
	bw.mu.Lock()
	defer bw.mu.Unlock()
	bw.gen.Add(1)
	if key != "" {
		for _, bl := range bw.byKey[key] {
			bl.notice()
		}
		return
	}
	for _, ls := range bw.byKey {
		for _, bl := range ls {
			bl.notice()
		}
	}
}

// breakChecks reads the keys of the locks that heard a break notice (or
// whose SUBSCRIBE was confirmed, or whose pub/sub connection was lost):
// one goroutine per Locker while any is queued, each round one pipeline
// of reads of at most maxBreakChecks keys, bounded by breakCheckTimeout. A
// Locker holding many locks whose subscriptions are confirmed at once
// reads their keys in a few round trips, not one each.
type breakChecks struct {
	mu      sync.Mutex
	pending []*breakListener
	running bool
}

// maxBreakChecks caps the reads of one round trip.
const maxBreakChecks = 1000

func (bc *breakChecks) add(bl *breakListener) {
	bc.mu.Lock()
	defer bc.mu.Unlock()
	bc.pending = append(bc.pending, bl)
	if !bc.running {
		bc.running = true
		// Not background work: it lasts while locks hear notices.
		go bc.run(bl.l.b.node)
	}
}

func (bc *breakChecks) run(node *redisproto.Node) {
	for {
		bc.mu.Lock()
		batch := bc.pending
		if len(batch) > maxBreakChecks {
			batch = batch[:maxBreakChecks:maxBreakChecks]
		}
		bc.pending = bc.pending[len(batch):]
		if len(batch) == 0 {
			bc.pending = nil
			bc.running = false
			bc.mu.Unlock()
			return
		}
		bc.mu.Unlock()
		qs := make([]redisproto.HoldsQuery, 0, len(batch))
		live := batch[:0]
		for _, bl := range batch {
			// A notice from now on queues the listener again: the read
			// below may have been sent before the break it announces.
			bl.queued.Store(false)
			if bl.done.Load() {
				continue
			}
			live = append(live, bl)
			q := redisproto.HoldsQuery{Key: bl.l.key, Owner: bl.l.owner, Group: bl.l.group}
			if bl.l.tair {
				q.Value = bl.l.owner
			}
			qs = append(qs, q)
		}
		if len(qs) == 0 {
			continue
		}
		type answers struct {
			held []bool
			errs []error
		}
		ctx, cancel := context.WithTimeout(context.Background(), breakCheckTimeout)
		a, _, abandoned := redisproto.Await(ctx, func(c context.Context) (answers, error) {
			held, errs := node.HoldsAll(c, qs)
			return answers{held, errs}, nil
		})
		cancel()
		if abandoned {
			continue // unknown: the renewals report
		}
		for i, bl := range live {
			if a.errs[i] == nil && !a.held[i] && bl.done.CompareAndSwap(false, true) {
				// On a goroutine of its own: losing a lock runs its
				// Observer, which must not hold up the others' losses.
				go bl.lose(fmt.Errorf("%w: redis key %s no longer holds owner %s (broken)", dlock.ErrNotHeld, node.LockKey(bl.l.key), bl.l.ownerID()))
			}
		}
	}
}
