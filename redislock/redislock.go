package redislock

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/background"
	"github.com/dlock-go/dlock/redislock/redisproto"
)

// Defaults.
const (
	// DefaultPrefix starts every key dlock writes: "dlock:{<key>}".
	DefaultPrefix = "dlock"
	// MinTTL is the shortest lease this backend accepts.
	MinTTL = dlock.MinTTL
	// FenceRetention is how long a released key keeps its last fencing
	// token (the "|<token>" marker; see the package documentation).
	FenceRetention = time.Hour
	// MetaReservedForWaiter is the metadata key of a *dlock.NotAcquiredError
	// for a key nobody holds but that a release reserved (for 100ms) for
	// the waiter it woke: its value is that waiter's id, Holder is empty
	// and TTL is the reservation left.
	MetaReservedForWaiter = redisproto.MetaReservedForWaiter
)

// Option configures a Locker.
type Option func(*options)

type options struct {
	prefix string
}

// WithPrefix sets the key prefix (default DefaultPrefix). Lockers must use
// the same prefix to exclude each other.
func WithPrefix(p string) Option { return func(o *options) { o.prefix = p } }

// Locker is a lock service on one Redis deployment (standalone, Sentinel
// or Cluster through a go-redis UniversalClient). It never closes the
// client. All locks taken through one Locker are renewed together by one
// watchdog, one pipelined round trip per tick.
type Locker struct {
	*dlock.Acquirer
	b *backend
}

var _ dlock.Locker = (*Locker)(nil)

// New returns a Locker on client. A nil client gives a Locker whose every
// call fails with dlock.ErrNilClient.
func New(client redis.UniversalClient, opts ...Option) *Locker {
	o := options{prefix: DefaultPrefix}
	for _, f := range opts {
		if f != nil {
			f(&o)
		}
	}
	if o.prefix == "" {
		o.prefix = DefaultPrefix
	}
	b := &backend{}
	if !redisproto.IsNil(client) {
		b.node = redisproto.NewNode(client, o.prefix)
	}
	return &Locker{Acquirer: dlock.NewAcquirer(b, MinTTL), b: b}
}

type backend struct {
	node    *redisproto.Node // nil when constructed with a nil client
	waiters redisproto.Waiters
}

// LockKey is the Redis key holding key's lease.
func (l *Locker) LockKey(key string) string {
	if l.b.node == nil {
		return ""
	}
	return l.b.node.LockKey(key)
}

func (b *backend) check() error {
	if b.node == nil {
		return fmt.Errorf("%w: redislock.New was given a nil redis client", dlock.ErrNilClient)
	}
	return nil
}

// Try implements dlock.Backend.
func (b *backend) Try(ctx context.Context, req *dlock.Request) (dlock.Grant, error) {
	if err := b.check(); err != nil {
		return dlock.Grant{}, err
	}
	meta, err := redisproto.EncodeMetadata(req.Config.Metadata)
	if err != nil {
		return dlock.Grant{}, err
	}
	defer b.waiters.Begin(req.WaitID)() // may queue the waiter
	o, err := b.node.Acquire(ctx, req.Key, req.Owner, req.Config.TTL, meta, req.WaitID)
	if err != nil {
		return dlock.Grant{}, fmt.Errorf("dlock: redis acquire %q: %w", req.Key, err)
	}
	if o.Granted {
		return dlock.Grant{Lease: &lease{b: b, key: req.Key, owner: req.Owner, token: o.Token}, Token: o.Token}, nil
	}
	na := &dlock.NotAcquiredError{Key: req.Key, Holder: o.Holder.Owner, Metadata: o.Holder.Metadata, TTL: o.PTTL}
	if o.ReservedFor != "" {
		na.Cause = reservedError(o.ReservedFor)
	}
	return dlock.Grant{}, na
}

// reservedError explains a NotAcquiredError for a key that nobody holds
// but that a release reserved for the waiter it woke.
func reservedError(id string) error {
	return fmt.Errorf("nobody holds it: the last release reserved it for waiter %s, which it woke (a hand-over in progress)", id)
}

// Abort implements dlock.Aborter: delete the lease if the lost reply had
// granted it.
func (b *backend) Abort(ctx context.Context, req *dlock.Request) error {
	if err := b.check(); err != nil {
		return err
	}
	return (&lease{b: b, key: req.Key, owner: req.Owner}).Release(ctx)
}

// Watch implements dlock.Watcher: the waiter listens on a channel of its
// own; its failed attempts queue it, and each release wakes the first
// queued waiter still listening, so one waiter retries, not all. Closing
// the subscription (Acquire returned) removes the waiter from the queue in
// the background, once none of its attempts is in flight.
func (b *backend) Watch(ctx context.Context, key string) (dlock.Subscription, error) {
	if err := b.check(); err != nil {
		return nil, err
	}
	id := dlock.NewOwner()[:16]
	s, err := b.node.Watch(ctx, key, id)
	if err != nil {
		return nil, err
	}
	return &waiter{Subscription: s, w: b.waiters.Add(key, id, b.node), id: id}, nil
}

type waiter struct {
	*redisproto.Subscription
	w  *redisproto.Waiter
	id string
}

func (w *waiter) WaitID() string { return w.id }

// Close ends the subscription and dequeues the waiter; it never waits on
// the network.
func (w *waiter) Close() {
	w.Subscription.Close()
	w.w.Leave()
}

// RefreshBatch implements dlock.BatchRenewer: one pipeline of
// compare-and-pexpire scripts per server (on a Cluster, per master, the
// masters concurrently), each renewal reported as soon as its server
// answered. It returns when all are reported or ctx is done, whichever
// comes first: a hung server holds up neither the other servers' renewals
// nor the watchdog (the pipelines left behind end with the client's
// timeouts; their results are dropped).
func (b *backend) RefreshBatch(ctx context.Context, rs []dlock.Renewal, done func(int, error)) {
	if err := b.check(); err != nil {
		for i := range rs {
			done(i, err)
		}
		return
	}
	batch := make([]redisproto.Renewal, len(rs))
	leases := make([]*lease, len(rs))
	for i, r := range rs {
		l := r.Lease.(*lease)
		leases[i] = l
		batch[i] = redisproto.Renewal{Key: l.key, Owner: l.owner, TTL: r.TTL}
	}
	var (
		mu     sync.Mutex
		closed bool
		left   = len(rs)
		all    = make(chan struct{})
	)
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

type lease struct {
	b          *backend
	key, owner string
	token      uint64 // 0 when unknown (Abort)
}

func (l *lease) result(op string, held bool, err error) error {
	switch {
	case err != nil:
		return fmt.Errorf("dlock: redis %s %q: %w", op, l.key, err)
	case !held:
		return fmt.Errorf("%w: redis key %s no longer holds owner %s", dlock.ErrNotHeld, l.b.node.LockKey(l.key), l.owner)
	}
	return nil
}

// Refresh implements dlock.Lease (compare-and-pexpire).
func (l *lease) Refresh(ctx context.Context, ttl time.Duration) error {
	held, err := l.b.node.Refresh(ctx, l.key, l.owner, ttl)
	return l.result("refresh", held, err)
}

// Release implements dlock.Lease (compare-and-replace with the release
// marker, then publish). A release that already took effect (a retry
// after a lost reply or an error) succeeds again.
func (l *lease) Release(ctx context.Context) error {
	held, err := l.b.node.Release(ctx, l.key, l.owner, l.token, FenceRetention)
	return l.result("release", held, err)
}

// errNilContext is returned by the entry points that take a context (List
// and the Guard's methods) for a nil one, like dlock's Acquire does.
var errNilContext = fmt.Errorf("%w: redislock: nil context", dlock.ErrInvalidOption)

// Info describes a held lock, as stored in Redis.
type Info = redisproto.Info

// List returns the locks currently held whose key starts with prefix, by
// scanning the keyspace (SCAN, on every master of a Cluster). It is meant
// for operators (dlock ls), not for hot paths. It returns by ctx's
// deadline even when the server does not answer (an error wrapping
// dlock.ErrUnavailable).
func (l *Locker) List(ctx context.Context, prefix string) ([]Info, error) {
	if ctx == nil {
		return nil, errNilContext
	}
	if err := l.b.check(); err != nil {
		return nil, err
	}
	infos, err, abandoned := redisproto.Await(ctx, func(ctx context.Context) ([]Info, error) {
		return l.b.node.List(ctx, prefix)
	})
	switch {
	case abandoned:
		return nil, fmt.Errorf("%w: redis list: no answer before the context ended: %w", dlock.ErrUnavailable, err)
	case err != nil:
		return nil, fmt.Errorf("dlock: redis list: %w", err)
	}
	return infos, nil
}
