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
	// lastReply is when a request last got the server's answer (unix ns).
	lastReply atomic.Int64
	hooks     atomic.Pointer[testHooks]
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
	// hasSession replaces the client's state check of a request's resend.
	hasSession func() bool
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

// noServerPause is how often call looks for the client's session before
// sending once more a request the client dropped unsent (zk.ErrNoServer).
const noServerPause = 10 * time.Millisecond

// result is one go-zookeeper call's outcome.
type result[T any] struct {
	v   T
	err error
}

// call runs fn, a blocking go-zookeeper call, bounded by ctx and the
// request timeout; a request the client dropped unsent while reconnecting
// is sent once more, once it has a session. go-zookeeper calls take no
// context: one ends when its reply arrives or the connection drops (the
// client gives up on a silent server after two thirds of the session
// timeout). When ctx or the request timeout ends first, call returns at
// once and fn finishes in the background. A reply that is there when they
// end is taken, not dropped: a process that was not running for a while
// (a loaded machine) finds both ready at once.
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
	done := make(chan result[T], 1)
	// resend: see resendState. A request the client dropped unsent
	// (zk.ErrNoServer: as it went round its servers to reconnect; with one
	// address, at every reconnection, even when the next dial succeeds)
	// while the server answered a moment ago (a reconnection, not an
	// outage that has lasted) is sent once more when the client has a
	// session again, unless the caller has given up by then: it then
	// hears that nothing was sent.
	var resend atomic.Int32
	background.Go(func() {
		v, err := fn()
		if errors.Is(err, zk.ErrNoServer) && b.answeredWithin(sessionWait) && resend.CompareAndSwap(sending, dropped) {
			if b.awaitSession(&resend) && resend.CompareAndSwap(dropped, resent) {
				v, err = fn()
			}
		}
		b.noteReply(err)
		done <- result[T]{v, err}
	})
	if h := b.hooks.Load(); h != nil && h.waiting != nil {
		h.waiting(func() bool { return len(done) > 0 })
	}
	// gaveUp ends the wait: the reply if it is there, else nothing sent
	// if the resend is still to come, else err.
	gaveUp := func(err error) (T, error) {
		select {
		case r := <-done:
			return outcome(what, r)
		default:
		}
		if resend.CompareAndSwap(dropped, abandoned) {
			return outcome(what, result[T]{err: zk.ErrNoServer})
		}
		resend.CompareAndSwap(sending, abandoned) // no resend after this
		return zero, err
	}
	select {
	case r := <-done:
		return outcome(what, r)
	case <-ctx.Done():
		return gaveUp(fmt.Errorf("dlock: zookeeper %s: %w", what, context.Cause(ctx)))
	case <-t.C:
		return gaveUp(fmt.Errorf("%w: zookeeper %s: no answer within the request timeout %v", dlock.ErrUnavailable, what, b.timeout))
	}
}

// resendState is where a call stands with a request the client dropped
// unsent.
const (
	sending   = iota // the first send is under way
	dropped          // dropped unsent; waiting for a session to send it again
	resent           // sent again
	abandoned        // the caller gave up first: it is not sent again
)

// sessionWait bounds how long a request dropped unsent waits for the
// client's session before the call reports that nothing was sent: a
// client reconnecting to a server that is up has one within go-zookeeper's
// one-second pause between rounds of its servers and a dial. It is also
// how recent the server's last answer must be for the wait: in an outage
// that has lasted longer, a drop is reported at once.
const sessionWait = 3 * time.Second

// awaitSession waits until the client has a session (polling its state),
// the call is abandoned, or sessionWait has passed; it reports whether
// the client has one.
func (b *backend) awaitSession(resend *atomic.Int32) bool {
	for end := time.Now().Add(sessionWait); time.Now().Before(end); time.Sleep(noServerPause) {
		if resend.Load() == abandoned {
			return false
		}
		if b.hasSession() {
			return true
		}
	}
	return false
}

// noteReply records that a request got the server's answer: err is nil
// or the server's refusal, not a lost or missing connection.
func (b *backend) noteReply(err error) {
	switch {
	case err == nil:
	case errors.Is(err, zk.ErrNoServer), errors.Is(err, zk.ErrConnectionClosed), errors.Is(err, zk.ErrClosing),
		errors.Is(err, zk.ErrSessionExpired), driver.Unreachable(err):
		return
	}
	b.lastReply.Store(time.Now().UnixNano())
}

// answeredWithin reports whether a request got the server's answer within
// d: the client was connected a moment ago, so a drop of unsent requests
// is a reconnection in progress rather than an outage that has lasted.
func (b *backend) answeredWithin(d time.Duration) bool {
	return time.Since(time.Unix(0, b.lastReply.Load())) < d
}

// hasSession reports whether the client is connected with a session.
func (b *backend) hasSession() bool {
	if h := b.hooks.Load(); h != nil && h.hasSession != nil {
		return h.hasSession()
	}
	return b.conn.State() == zk.StateHasSession
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
