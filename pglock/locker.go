// The Locker: New and its options, the backend state shared by the other
// files, and the Locker's calls forwarded to the engine.

package pglock

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// Defaults.
const (
	// DefaultTable is the lease table.
	DefaultTable = "dlock_leases"
	// DefaultRequestTimeout bounds each statement, within the caller's
	// context.
	DefaultRequestTimeout = 5 * time.Second
)

// Option configures a Locker, a Guard or Migrate: pglock's own options and
// the core's (dlock.WithObserver). Each is applied where it is meant and
// ignored elsewhere.
type Option = dlock.LockerOption

type options struct {
	table          string
	requestTimeout time.Duration
	noMigrate      bool
	noListen       bool
}

func defaultOptions() options { return options{table: DefaultTable} }

// WithTable names the lease table (default DefaultTable): a lower-case
// identifier, optionally schema-qualified ("app.locks"). Lockers exclude
// each other only on the same table.
func WithTable(name string) Option {
	return driver.Setting(func(o *options) { o.table = name })
}

// WithRequestTimeout bounds each statement (default DefaultRequestTimeout;
// zero means the default), within the caller's context. It is also the
// server-side idle-in-transaction and lock timeout of the one transaction
// pglock may run (an attempt that raced twice; see Try). A negative
// timeout makes every call fail with an error wrapping
// dlock.ErrInvalidOption.
func WithRequestTimeout(d time.Duration) Option {
	return driver.Setting(func(o *options) { o.requestTimeout = d })
}

// WithoutMigrate stops the Locker from creating its table on first use:
// run Migrate (or the SQL in migrations/) yourself. A missing table is
// then an error saying so.
func WithoutMigrate() Option {
	return driver.Setting(func(o *options) { o.noMigrate = true })
}

// WithoutListen turns off LISTEN/NOTIFY wake-ups: waiters poll (with
// dlock.WithBackoff's backoff). A pooler between the client and
// PostgreSQL is detected and turns them off by itself.
func WithoutListen() Option {
	return driver.Setting(func(o *options) { o.noListen = true })
}

// Locker is a lock service on a PostgreSQL database. It never closes the
// pool.
type Locker struct {
	e *dlock.Engine
	b *backend
}

var (
	_ dlock.Locker        = (*Locker)(nil)
	_ dlock.Lister        = (*Locker)(nil)
	_ driver.Driver       = (*backend)(nil)
	_ driver.Aborter      = (*backend)(nil)
	_ driver.BatchRenewer = (*backend)(nil)
	_ driver.Watcher      = (*backend)(nil)
	_ driver.Leaver       = (*backend)(nil)
	_ driver.Lease        = (*lease)(nil)
)

var (
	_ dlock.Breaker  = (*Locker)(nil)
	_ driver.Breaker = (*backend)(nil)
)

var _ driver.LossNotifier = (*lease)(nil)

// backend implements driver.Driver on a pgx pool.
type backend struct {
	pool    *pgxpool.Pool
	n       names
	timeout time.Duration
	stmt    *stmtMode // the mode passed to every statement
	migrate bool
	l       *listener // nil: WithoutListen
	held    heldWatch // its locks that listen for breaks (lease.go)

	mu       sync.Mutex
	migrated bool

	regMu sync.Mutex
	regs  map[waiterKey]registration // waiting writers this Locker registered (see register)

	lastOK atomic.Int64 // when the last statement PostgreSQL answered was sent (unix ns)

	wakeOff atomic.Bool // the writers table has no wake column: notices name no writer
}

// New returns a Locker on pool. A nil pool gives a Locker whose every call
// fails with an error wrapping dlock.ErrNilClient; an invalid WithTable or
// a negative WithRequestTimeout, with one wrapping dlock.ErrInvalidOption.
// opts may also hold the core's options (dlock.WithObserver).
func New(pool *pgxpool.Pool, opts ...Option) *Locker {
	o := defaultOptions()
	driver.Apply(&o, opts)
	b := &backend{pool: pool, timeout: o.requestTimeout, migrate: !o.noMigrate}
	fail := func(err error) *Locker { return &Locker{e: dlock.NewEngine(driver.Failed(err)), b: b} }
	n, err := namesFor(o.table)
	switch {
	case pool == nil:
		return fail(fmt.Errorf("%w: pglock.New was given a nil pool", dlock.ErrNilClient))
	case err != nil:
		return fail(err)
	case o.requestTimeout < 0:
		return fail(fmt.Errorf("%w: pglock: negative request timeout %v", dlock.ErrInvalidOption, o.requestTimeout))
	case o.requestTimeout == 0:
		b.timeout = DefaultRequestTimeout
	}
	b.n = n
	b.stmt = newStmtMode(pool, b.timeout)
	if !o.noListen {
		b.l = newListener(b)
	}
	b.held.b = b
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

// Spec implements driver.Driver: exclusive, shared and limited locks.
func (b *backend) Spec() driver.Spec {
	return driver.Spec{Name: "postgres", MinTTL: dlock.MinTTL, Shared: true, Limited: true}
}

// rpc bounds one statement by the request timeout.
func (b *backend) rpc(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, b.timeout)
}
