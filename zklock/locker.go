// The Locker: New and its options, the backend state shared by the other
// files, and the bounds every request to ZooKeeper runs under.

package zklock

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/background"
)

// Defaults.
const (
	// DefaultPrefix is the znode under which every lock lives: lock KEY is
	// the znode DefaultPrefix + "/" + EscapeKey(KEY), and its queue nodes
	// are that znode's children.
	DefaultPrefix = "/dlock"
	// DefaultRequestTimeout bounds each request to ZooKeeper (go-zookeeper
	// keeps a request queued while it is disconnected, so an unreachable
	// ensemble would otherwise look like a held lock).
	DefaultRequestTimeout = 5 * time.Second
	// MinSessionTimeout is the shortest session timeout a Locker works
	// with: the lease is two thirds of it and must leave room for the
	// drift allowance and renewals.
	MinSessionTimeout = 300 * time.Millisecond
)

// Option configures a Locker, a Guard or Connect: zklock's own options
// below and the core's (dlock.WithObserver). Each is applied where it is
// meant and ignored elsewhere.
type Option = dlock.LockerOption

type options struct {
	prefix         string
	requestTimeout time.Duration
	sessionTimeout time.Duration
	user, password string
	digest         bool
	logger         zk.Logger
}

// WithPrefix puts every lock under the znode p (default DefaultPrefix),
// an absolute ZooKeeper path. It is created (as persistent nodes) when
// first needed.
func WithPrefix(p string) Option {
	return driver.Setting(func(o *options) { o.prefix = p })
}

// WithRequestTimeout bounds each request to ZooKeeper (default
// DefaultRequestTimeout; zero means the default), within the caller's
// context. A negative timeout makes every call fail with an error wrapping
// dlock.ErrInvalidOption.
func WithRequestTimeout(d time.Duration) Option {
	return driver.Setting(func(o *options) { o.requestTimeout = d })
}

// WithSessionTimeout tells New the session timeout of a connection made
// with zk.Connect: the timeout passed to it. zklock cannot read the
// timeout the ensemble granted from such a connection, and trusts d: if
// the servers grant less (a maxSessionTimeout below d), a lock may be
// reported held after its session expired. Prefer Connect, which reads
// the granted timeout; for its connections this option is ignored.
func WithSessionTimeout(d time.Duration) Option {
	return driver.Setting(func(o *options) { o.sessionTimeout = d })
}

// WithDigest makes Connect authenticate with ZooKeeper's digest scheme as
// user:password (and again after every reconnect), and makes the Locker
// create its znodes readable and writable by that identity only
// (zk.DigestACL). A wrong password is not refused at connect time
// (ZooKeeper's digest scheme never refuses an identity): it shows as an
// error wrapping zk.ErrNoAuth on the first lock of a path made by the
// right one.
func WithDigest(user, password string) Option {
	return driver.Setting(func(o *options) { o.user, o.password, o.digest = user, password, true })
}

// WithLogger sets the go-zookeeper client's logger for Connect (default:
// the client's own, the standard log package).
func WithLogger(l zk.Logger) Option {
	return driver.Setting(func(o *options) { o.logger = l })
}

// Locker is a lock service on a ZooKeeper ensemble. It never closes the
// connection.
type Locker struct {
	e *dlock.Engine
	b *backend
}

var (
	_ dlock.Locker        = (*Locker)(nil)
	_ dlock.Lister        = (*Locker)(nil)
	_ driver.Driver       = (*backend)(nil)
	_ driver.Queuer       = (*backend)(nil)
	_ driver.Aborter      = (*backend)(nil)
	_ driver.BatchRenewer = (*backend)(nil)
	_ driver.Lease        = (*entry)(nil)
	_ driver.LossNotifier = (*entry)(nil)
)

// backend implements driver.Driver on a go-zookeeper connection.
type backend struct {
	conn    *zk.Conn
	prefix  string
	timeout time.Duration
	acl     []zk.ACL
	info    *sessionInfo  // from Connect; nil otherwise
	fixed   time.Duration // WithSessionTimeout, for connections not from Connect

	watchEvents atomic.Int64 // watch events its waiters and holders received
	hooks       atomic.Pointer[testHooks]
}

// testHooks let tests see and schedule the backend's steps (see
// export_test.go); nil outside tests.
type testHooks struct {
	beforeCreate func()          // on the create's goroutine, before it is sent
	afterCreate  func(err error) // on the create's goroutine, once it returned
	aborted      func(err error) // when Abort returns
	// beforeOrphanDelete runs before a node nobody uses is deleted.
	beforeOrphanDelete func()
	// childWatch replaces the watch of a wait on a key's children.
	childWatch func(<-chan zk.Event) <-chan zk.Event
	// request runs before each request call sends, with its name.
	request func(what string)
	// waiting runs once a request was started, before call waits for
	// its reply; replied reports whether the reply is there.
	waiting func(replied func() bool)
}

// New returns a Locker on conn. conn should come from Connect, which
// records the session timeout the ensemble granted; for a connection from
// zk.Connect pass WithSessionTimeout. Otherwise, and for a nil conn, an
// invalid WithPrefix, a negative WithRequestTimeout or a session timeout
// below MinSessionTimeout, every call of the Locker fails with an error
// saying so (wrapping dlock.ErrNilClient or dlock.ErrInvalidOption). opts
// may also hold the core's options (dlock.WithObserver).
func New(conn *zk.Conn, opts ...Option) *Locker {
	o := options{prefix: DefaultPrefix}
	driver.Apply(&o, opts)
	b := &backend{conn: conn, prefix: o.prefix, timeout: o.requestTimeout, acl: zk.WorldACL(zk.PermAll)}
	if o.digest {
		b.acl = zk.DigestACL(zk.PermAll, o.user, o.password)
	}
	if b.timeout == 0 {
		b.timeout = DefaultRequestTimeout
	}
	fail := func(err error) *Locker { return &Locker{e: dlock.NewEngine(driver.Failed(err)), b: b} }
	switch {
	case conn == nil:
		return fail(fmt.Errorf("%w: zklock.New was given a nil *zk.Conn", dlock.ErrNilClient))
	case o.requestTimeout < 0:
		return fail(fmt.Errorf("%w: zklock: negative request timeout %v", dlock.ErrInvalidOption, o.requestTimeout))
	case !validPrefix(o.prefix):
		return fail(fmt.Errorf("%w: zklock: prefix %q is not an absolute ZooKeeper path", dlock.ErrInvalidOption, o.prefix))
	}
	if b.prefix == "/" {
		b.prefix = ""
	}
	if b.info = lookup(conn); b.info == nil {
		switch {
		case o.sessionTimeout == 0:
			return fail(fmt.Errorf("%w: %w", dlock.ErrInvalidOption, errNoTimeout))
		case o.sessionTimeout < MinSessionTimeout || o.sessionTimeout > dlock.MaxTTL:
			return fail(fmt.Errorf("%w: zklock: session timeout %v out of range [%v, %v]", dlock.ErrInvalidOption, o.sessionTimeout, MinSessionTimeout, dlock.MaxTTL))
		}
		b.fixed = o.sessionTimeout
	}
	return &Locker{e: dlock.NewEngine(b, opts...), b: b}
}

var errNoTimeout = errors.New("dlock: zklock: the connection's session timeout is unknown: connect with zklock.Connect, or pass zklock.WithSessionTimeout with the timeout given to zk.Connect")

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

// Path returns the znode of key's queue under this Locker's prefix
// (DefaultPrefix for the zero Locker).
func (l *Locker) Path(key string) string {
	if l == nil || l.b == nil {
		return DefaultPrefix + "/" + EscapeKey(key)
	}
	return l.b.keyPath(key)
}

// Spec implements driver.Driver: exclusive, shared and limited locks.
func (b *backend) Spec() driver.Spec {
	return driver.Spec{Name: "zookeeper", MinTTL: dlock.MinTTL, Shared: true, Limited: true}
}

func (b *backend) keyPath(key string) string { return b.prefix + "/" + EscapeKey(key) }

// noServerPause is how long call waits before sending once more a
// request the client dropped unsent (zk.ErrNoServer).
const noServerPause = 10 * time.Millisecond

// result is one go-zookeeper call's outcome.
type result[T any] struct {
	v   T
	err error
}

// call runs fn, a blocking go-zookeeper call, bounded by ctx and the
// request timeout; a request the client dropped unsent while reconnecting
// is sent once more. go-zookeeper calls take no context: one ends when its
// reply arrives or the connection drops (the client gives up on a silent
// server after two thirds of the session timeout). When ctx or the
// request timeout ends first, call returns at once and fn finishes in the
// background. A reply that is there when they end is taken, not dropped:
// a process that was not running for a while (a loaded machine) finds
// both ready at once.
func call[T any](ctx context.Context, b *backend, what string, fn func() (T, error)) (T, error) {
	var zero T
	if err := ctx.Err(); err != nil {
		return zero, fmt.Errorf("dlock: zookeeper %s: %w", what, context.Cause(ctx))
	}
	if h := b.hooks.Load(); h != nil && h.request != nil {
		h.request(what)
	}
	t := time.NewTimer(b.timeout)
	defer t.Stop()
	done, stop := make(chan result[T], 1), make(chan struct{})
	defer close(stop)
	background.Go(func() {
		v, err := fn()
		// ErrNoServer: the client dropped the request unsent as it went
		// round its servers to reconnect (with one address, at every
		// reconnection), whether or not the next dial succeeds. Sent
		// once more, it waits in the client's queue for that dial: a
		// server that is back takes it; one still down drops it again a
		// second later, and the caller hears of the outage as before.
		if errors.Is(err, zk.ErrNoServer) {
			select {
			case <-stop:
			case <-time.After(noServerPause):
				v, err = fn()
			}
		}
		done <- result[T]{v, err}
	})
	if h := b.hooks.Load(); h != nil && h.waiting != nil {
		h.waiting(func() bool { return len(done) > 0 })
	}
	select {
	case r := <-done:
		return outcome(what, r)
	case <-ctx.Done():
		select {
		case r := <-done:
			return outcome(what, r)
		default:
		}
		return zero, fmt.Errorf("dlock: zookeeper %s: %w", what, context.Cause(ctx))
	case <-t.C:
		select {
		case r := <-done:
			return outcome(what, r)
		default:
		}
		return zero, fmt.Errorf("%w: zookeeper %s: no answer within the request timeout %v", dlock.ErrUnavailable, what, b.timeout)
	}
}

// outcome is what call returns for fn's result r.
func outcome[T any](what string, r result[T]) (T, error) {
	switch {
	case r.err == nil:
		return r.v, nil
	case errors.Is(r.err, zk.ErrNoServer):
		// The client could not reach any server and never sent the
		// request: nothing happened, and a retry may succeed.
		return r.v, dlock.Unavailable(fmt.Errorf("%w: zookeeper %s: %w", dlock.ErrTransient, what, r.err))
	case errors.Is(r.err, zk.ErrConnectionClosed), driver.Unreachable(r.err):
		// The connection dropped under the request (refused, reset,
		// or closed by the client when the server went silent): the
		// request may or may not have taken effect.
		return r.v, dlock.Unavailable(fmt.Errorf("dlock: zookeeper %s: %w", what, r.err))
	case errors.Is(r.err, zk.ErrNoAuth):
		return r.v, fmt.Errorf("dlock: zookeeper %s: %w (this client is not authorized: check the digest credentials and the ACL of the znodes under the prefix)", what, r.err)
	}
	return r.v, fmt.Errorf("dlock: zookeeper %s: %w", what, r.err)
}
