// The Locker: New and its options, the backend state shared by the other
// files, and the bounds every request to etcd runs under.

package etcdlock

import (
	"context"
	"fmt"
	"sync"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// Defaults.
const (
	// DefaultPrefix is empty: lock KEY lives under "KEY/", exactly where
	// `etcdctl lock KEY` and concurrency.NewMutex(s, "KEY") put it (for
	// keys without '/' or '%'; see docs/etcdlock.md).
	DefaultPrefix = ""
	// MinTTL is the shortest lease this backend accepts. etcd leases are
	// whole seconds and the server enforces its own minimum (1.5 × the
	// election timeout, 2s by default): the lease a lock gets is the one
	// etcd applied, which may be longer than the TTL asked for, never
	// shorter, and the lock's TTL() reports it.
	MinTTL = dlock.MinTTL
	// DefaultRequestTimeout bounds each request to etcd (the etcd client
	// otherwise waits for a connection for as long as the context allows,
	// so an unreachable cluster would look like a held lock).
	DefaultRequestTimeout = 5 * time.Second
	// maxTxnOps is etcd's default limit of operations per transaction.
	maxTxnOps = 128
)

// Option configures a Locker or a Guard: etcdlock's own options below and
// the core's (dlock.WithObserver). Each is applied where it is meant and
// ignored elsewhere.
type Option = dlock.LockerOption

type options struct {
	prefix         string
	requestTimeout time.Duration
}

// WithPrefix puts every lock under prefix (default DefaultPrefix): lock KEY
// then lives under "<prefix>KEY/". Use the same prefix as the etcdctl or
// concurrency.Mutex users it must exclude.
func WithPrefix(p string) Option {
	return driver.Setting(func(o *options) { o.prefix = p })
}

// WithRequestTimeout bounds each request to etcd (default
// DefaultRequestTimeout; zero means the default), within the caller's
// context. A negative timeout makes every call of the Locker fail with an
// error wrapping dlock.ErrInvalidOption.
func WithRequestTimeout(d time.Duration) Option {
	return driver.Setting(func(o *options) { o.requestTimeout = d })
}

// Locker is a lock service on an etcd cluster. It never closes the client.
type Locker struct {
	e *dlock.Engine
	b *backend
}

var (
	_ dlock.Locker        = (*Locker)(nil)
	_ dlock.Lister        = (*Locker)(nil)
	_ dlock.Breaker       = (*Locker)(nil)
	_ driver.Driver       = (*backend)(nil)
	_ driver.Queuer       = (*backend)(nil)
	_ driver.BatchRenewer = (*backend)(nil)
	_ driver.Aborter      = (*backend)(nil)
	_ driver.Breaker      = (*backend)(nil)
	_ driver.Lease        = (*entry)(nil)
	_ driver.LossNotifier = (*entry)(nil)
)

// backend implements driver.Driver (and its optional capabilities) on an
// etcd client.
type backend struct {
	client  *clientv3.Client
	prefix  string
	timeout time.Duration

	mu       sync.Mutex
	sessions map[int64][]*session // by requested lease TTL in seconds
	orphans  map[*entry]struct{}  // entries whose delete is pending
	spent    map[string]struct{}  // receipts no release will ask for: delete them
}

// New returns a Locker on client. A nil client gives a Locker whose every
// call fails with an error wrapping dlock.ErrNilClient, and a negative
// WithRequestTimeout one whose every call fails with an error wrapping
// dlock.ErrInvalidOption. opts may also hold the core's options
// (dlock.WithObserver); the Guard's (WithGuardPrefix) are ignored.
func New(client *clientv3.Client, opts ...Option) *Locker {
	o := options{prefix: DefaultPrefix}
	driver.Apply(&o, opts)
	b := &backend{client: client, prefix: o.prefix, timeout: o.requestTimeout,
		sessions: map[int64][]*session{}, orphans: map[*entry]struct{}{}, spent: map[string]struct{}{}}
	switch {
	case client == nil:
		return &Locker{e: dlock.NewEngine(driver.Failed(fmt.Errorf("%w: etcdlock.New was given a nil etcd client", dlock.ErrNilClient))), b: b}
	case o.requestTimeout < 0:
		return &Locker{e: dlock.NewEngine(driver.Failed(fmt.Errorf("%w: etcdlock: negative request timeout %v", dlock.ErrInvalidOption, o.requestTimeout))), b: b}
	case o.requestTimeout == 0:
		b.timeout = DefaultRequestTimeout
	}
	return &Locker{e: dlock.NewEngine(b, opts...), b: b}
}

// Acquire implements dlock.Locker.
func (l *Locker) Acquire(ctx context.Context, key string, opts ...dlock.Option) (*dlock.Lock, error) {
	return l.engine().Acquire(ctx, key, opts...)
}

// TryAcquire implements dlock.Locker.
func (l *Locker) TryAcquire(ctx context.Context, key string, opts ...dlock.Option) (*dlock.Lock, error) {
	return l.engine().TryAcquire(ctx, key, opts...)
}

// engine is l's Engine, nil for a nil *Locker: every call of a nil *Locker
// then fails with an error wrapping dlock.ErrNilClient instead of panicking.
func (l *Locker) engine() *dlock.Engine {
	if l == nil {
		return nil
	}
	return l.e
}

// Break implements dlock.Breaker (see dlock.Break). It reads the key's
// queue, picks the entries that hold it (the head and the shared or
// limited entries holding with it; with an owner, that owner's entry among
// them) and deletes them in one transaction that compares each one's
// create revision, so an entry that changed meanwhile is never deleted: the
// queue is read again instead. Waiting entries stay in the queue; the
// first of them is woken by the deletion, as by a release, and its token
// (its create revision) is above every broken one's. A forced break also
// removes the holding entries of etcdctl and concurrency.Mutex. The broken
// holders' etcd leases are left alone (they may carry other locks).
func (l *Locker) Break(ctx context.Context, key, owner string) (dlock.Broken, error) {
	return l.engine().Break(ctx, key, owner)
}

// Spec implements driver.Driver: exclusive, shared and limited locks.
func (b *backend) Spec() driver.Spec {
	return driver.Spec{Name: "etcd", MinTTL: MinTTL, Shared: true, Limited: true}
}

// rpc bounds one request by the request timeout.
func (b *backend) rpc(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, b.timeout)
}
