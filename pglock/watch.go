// Wake-ups: waiters of a key are woken by its release's NOTIFY, received
// on one LISTEN connection per Locker, open while some Acquire waits or a
// held lock listens for breaks, and for a short linger after. Break
// notices arriving on it are handed to the held locks' watch (lease.go).

package pglock

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/background"
)

// Timing of the LISTEN connection.
const (
	// listenLinger is how long the LISTEN connection stays open after
	// its last waiter left, for the next wait of the Locker to reuse (so
	// a Locker that waits again and again, as contenders on a busy key
	// do, does not open a server connection per wait and miss the
	// releases sent while it is opening).
	listenLinger = 2 * time.Second
	// listenCheck is how long the LISTEN connection may stay silent
	// before it is pinged: one that does not answer within the request
	// timeout (a hung server or a stalled link) is abandoned and opened
	// again.
	listenCheck = 10 * time.Second
	// listenRetry is the pause before a broken LISTEN connection is
	// opened again while someone waits.
	listenRetry = time.Second
)

// listener holds the LISTEN connection of a Locker while it has
// subscribers and for listenLinger after the last one left. The
// connection is its own, opened with the pool's configuration (and its
// BeforeConnect and AfterConnect hooks) but outside the pool, so waiting
// never takes a connection from the pool. A notification lost (the
// connection broke, or a transaction pooler sits between: NOTIFY does not
// cross one) delays a waiter by one poll step at most: the engine keeps
// polling with its backoff while it waits.
type listener struct {
	b      *backend
	linger time.Duration

	// noListen is set (to errPooled or errNoPID) once no LISTEN is to
	// be tried again: a LISTEN connection turned out to reach PostgreSQL
	// through a pooler, or the server refused the check (see
	// pooledConn). Waiters then poll.
	noListen atomic.Value // of error

	wakes     atomic.Int64 // subscriptions woken by a notice (tests)
	listening atomic.Bool  // a LISTEN connection is listening (tests)

	mu   sync.Mutex
	subs map[string]map[*sub]struct{}
	n    int
	cur  *listenRun // the running LISTEN loop; nil if none
}

// listenRun is one LISTEN loop, from the first waiter to the end of the
// linger after the last.
//
// A loop is background work (internal/background) only while it lingers,
// which ends on its own: while it has subscribers it lasts as long as
// they wait or hold locks.
type listenRun struct {
	cancel  context.CancelFunc
	done    chan struct{} // closed when the loop has returned
	idle    *time.Timer   // the linger: set while the loop runs without subscribers
	revived chan struct{} // closed when a subscriber ends the linger
}

func newListener(b *backend) *listener {
	return &listener{b: b, linger: listenLinger, subs: map[string]map[*sub]struct{}{}}
}

// sub is one waiter's subscription.
type sub struct {
	l      *listener
	key    string
	id     string // WaitID: the engine passes it with the waiter's attempts
	c      chan struct{}
	once   sync.Once
	waiter string // the Request.Waiter registered with id (l.mu)
}

var _ driver.WaitIDer = (*sub)(nil)

func (s *sub) C() <-chan struct{} { return s.c }

// WaitID implements driver.WaitIDer: the waiter's attempts carry it, so a
// registration as a waiting writer (register) can be tied to this
// subscription, which a release's wake notice then wakes alone.
func (s *sub) WaitID() string { return s.id }

func (s *sub) Close() {
	s.once.Do(func() { s.l.remove(s) })
}

// Watch implements driver.Watcher.
func (b *backend) Watch(ctx context.Context, key string) (driver.Subscription, error) {
	if b.l == nil {
		return nil, errNoListen
	}
	if err := b.l.gaveUp(); err != nil {
		return nil, err
	}
	return b.l.add(key), nil
}

var (
	errNoListen = errors.New("dlock: pglock: WithoutListen: waiters poll")
	errPooled   = errors.New("dlock: pglock: a pooler sits between the client and PostgreSQL: waiters poll")
	errNoPID    = errors.New("dlock: pglock: PostgreSQL refused pg_backend_pid(), so a pooler in between cannot be ruled out: waiters poll")
)

// gaveUp is why no LISTEN is tried any more; nil if it still is.
func (l *listener) gaveUp() error {
	err, _ := l.noListen.Load().(error)
	return err
}

// add subscribes to key, starting the LISTEN loop if none runs.
func (l *listener) add(key string) *sub {
	s := &sub{l: l, key: key, id: dlock.NewOwner(), c: make(chan struct{}, 1)}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.subs[key] == nil {
		l.subs[key] = map[*sub]struct{}{}
	}
	l.subs[key][s] = struct{}{}
	l.n++
	switch {
	case l.cur == nil:
		ctx, cancel := context.WithCancel(context.Background())
		r := &listenRun{cancel: cancel, done: make(chan struct{})}
		l.cur = r
		go l.run(ctx, r)
	case l.cur.idle != nil:
		// A lingering connection: it is listening already, so no
		// release is missed; keep it.
		l.cur.idle.Stop()
		l.cur.idle = nil
		close(l.cur.revived)
		l.cur.revived = nil
	}
	return s
}

func (l *listener) remove(s *sub) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if m := l.subs[s.key]; m != nil {
		if _, ok := m[s]; ok {
			delete(m, s)
			l.n--
		}
		if len(m) == 0 {
			delete(l.subs, s.key)
		}
	}
	if l.n == 0 && l.cur != nil && l.cur.idle == nil {
		r := l.cur
		r.idle = time.AfterFunc(l.linger, func() { l.stop(r) })
		rv := make(chan struct{})
		r.revived = rv
		background.Go(func() { // the linger, as background work
			select {
			case <-r.done:
			case <-rv:
			}
		})
	}
}

// stop ends r if it is still the running loop and still has no
// subscriber (its linger ran out, or its connection broke meanwhile).
func (l *listener) stop(r *listenRun) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cur != r || l.n > 0 {
		return false
	}
	if r.idle != nil {
		r.idle.Stop()
		r.idle = nil
	}
	r.cancel()
	l.cur = nil
	return true
}

// wakeNotice prefixes the notice of a release of a key that a writer
// waits for: "dlock-wake:<waiter>:<key>" wakes that waiter alone (see
// wakePayload). Waiter ids are hex: the first colon ends one.
const wakeNotice = "dlock-wake:"

// wakePayload is the SQL expression of the notice a release of the key
// keyExpr sends: it names the live waiting writer whose wait listens for
// notices (registered with wake) and whose registration expires first,
// not the waiter exceptExpr if given (a Leave's own), and only that
// writer wakes: a waiting writer keeps new readers out, so the others
// would only try and fail. The notice is the key itself, which wakes
// every waiter of the key, when no such writer waits (readers are then
// admitted together), when the release leaves a live limited holder
// other than ownerExpr, the releasing owner, whose row the statement's
// snapshot still shows (a freed permit: writers do not keep permits
// out), and when the writers table has no wake column (migration 3 not
// run). Waiters not woken keep polling (the engine's backoff), so a
// named writer that is gone costs the others a poll step.
func (b *backend) wakePayload(keyExpr, ownerExpr, exceptExpr string) string {
	if b.wakeOff.Load() {
		return keyExpr
	}
	n := b.n
	except := ""
	if exceptExpr != "" {
		except = ` AND w.waiter <> ` + exceptExpr
	}
	return `coalesce((SELECT '` + wakeNotice + `' || w.waiter || ':' || ` + keyExpr + ` FROM ` + n.writers + ` w
	WHERE w.key = ` + keyExpr + ` AND w.wake AND w.expires_at > clock_timestamp()` + except + `
	  AND NOT EXISTS (SELECT 1 FROM ` + n.holders + ` x WHERE x.key = ` + keyExpr + ` AND x.mode = 2 AND x.expires_at > clock_timestamp() AND NOT x.released AND x.owner <> ` + ownerExpr + `)
	ORDER BY w.expires_at, w.waiter LIMIT 1), ` + keyExpr + `)`
}

// noWakeColumn reports whether err is a statement's failure on a writers
// table without the wake column (a table not migrated to version 3, with
// WithoutMigrate), and if so turns naming writers off for the Locker:
// the statement failed before it did anything, and is run again without.
func (b *backend) noWakeColumn(err error) bool {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) || pe.Code != "42703" || !strings.Contains(pe.Message, "wake") {
		return false
	}
	return b.wakeOff.CompareAndSwap(false, true)
}

// tag ties the subscription of key with WaitID id to waiter, the
// Request.Waiter it registered as a waiting writer with.
func (l *listener) tag(key, id, waiter string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for s := range l.subs[key] {
		if s.id == id {
			s.waiter = waiter
		}
	}
}

// notify wakes the waiters of key; for a wake notice (wakeNotice, a
// waiter and a key), the subscription tagged with that waiter only; for
// a break notice (breakNotice and a key), it has the Locker's held locks
// of the key checked.
func (l *listener) notify(key string) {
	if k, ok := strings.CutPrefix(key, breakNotice); ok {
		l.b.held.broken(k) // not under l.mu: heldWatch.add locks h.mu, then l.mu
		// And the waiters of key itself, if a key begins so.
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if rest, ok := strings.CutPrefix(key, wakeNotice); ok {
		if waiter, k, ok := strings.Cut(rest, ":"); ok && waiter != "" {
			for s := range l.subs[k] {
				if s.waiter == waiter {
					l.wake(s)
				}
			}
		}
		// And the waiters of key itself, if a key begins so.
	}
	for s := range l.subs[key] {
		l.wake(s)
	}
}

// wake wakes s (l.mu held).
func (l *listener) wake(s *sub) {
	l.wakes.Add(1)
	select {
	case s.c <- struct{}{}:
	default:
	}
}

// wakeAll wakes every waiter (the connection was re-established: a
// release may have been missed meanwhile).
func (l *listener) wakeAll() {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.subs {
		for s := range m {
			select {
			case s.c <- struct{}{}:
			default:
			}
		}
	}
}

// run holds a LISTEN connection until ctx ends, reconnecting after a
// pause when it breaks while someone waits; a connection that breaks
// during the linger is not replaced.
func (l *listener) run(ctx context.Context, r *listenRun) {
	defer close(r.done)
	defer r.cancel()
	for ctx.Err() == nil {
		l.listenOnce(ctx)
		if l.gaveUp() != nil {
			// The waiters poll; held locks stop listening (woken, they
			// find gaveUp set); the linger ends the loop.
			l.wakeAll()
			<-ctx.Done()
			return
		}
		if l.stop(r) {
			return
		}
		t := time.NewTimer(listenRetry)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
}

// dial opens a connection as the pool would, but outside it (hangUp
// closes it). The pool's notification handler (ConnConfig.OnNotification),
// if any, is left out: with one, pgx buffers no notification and
// WaitForNotification returns none.
func (l *listener) dial(ctx context.Context) (*pgx.Conn, error) {
	pcfg := l.b.pool.Config()
	cfg := pcfg.ConnConfig.Copy()
	if pcfg.BeforeConnect != nil {
		if err := pcfg.BeforeConnect(ctx, cfg); err != nil {
			return nil, err
		}
	}
	cfg.OnNotification = nil
	c, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if pcfg.AfterConnect != nil {
		if err := pcfg.AfterConnect(ctx, c); err != nil {
			closeConn(c) // the pool calls no BeforeClose here either
			return nil, err
		}
	}
	return c, nil
}

// hangUp closes c, dialed by dial, running the pool's BeforeClose hook
// first as the pool does (so an application undoing in BeforeClose what
// AfterConnect set up is not left with an entry per LISTEN connection).
func (l *listener) hangUp(c *pgx.Conn) {
	if f := l.b.pool.Config().BeforeClose; f != nil {
		f(c)
	}
	closeConn(c)
}

// pooledConn reports whether c reaches PostgreSQL through a connection
// pooler, which would leave a LISTEN on a server session it shares with
// other clients: NOTIFY then never reaches this listener, and the server
// session, back in the pool, receives notifications nobody asked for
// (PgBouncer 1.18 in transaction mode logs "got packet 'A' from server
// when not linked" for each, and can exit on "server in bad state").
// The test: the backend process ID the connection was given at startup
// (BackendKeyData) is the server's own on a direct connection, and
// through a plain TCP proxy, but a pooler hands its clients keys of its
// own, since it multiplexes them over its server sessions.
func pooledConn(ctx context.Context, c *pgx.Conn) (bool, error) {
	var pid uint32
	if err := c.QueryRow(ctx, "SELECT pg_backend_pid()", pgx.QueryExecModeSimpleProtocol).Scan(&pid); err != nil {
		return false, err
	}
	return pid != c.PgConn().PID(), nil
}

// closeConn closes c, waiting for a hung server no longer than a second.
func closeConn(c *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c.Close(ctx)
}

func (l *listener) listenOnce(ctx context.Context) {
	b := l.b
	dctx, cancel := b.rpc(ctx)
	c, err := l.dial(dctx)
	cancel()
	if err != nil {
		return
	}
	defer l.hangUp(c)
	pctx, cancel := b.rpc(ctx)
	pooled, err := pooledConn(pctx, c)
	cancel()
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && (strings.HasPrefix(pgErr.Code, "42") || strings.HasPrefix(pgErr.Code, "0A")):
		// The server refused the check (pg_backend_pid() revoked: 42501;
		// a server without it: 42883, 0A000): the same answer each time,
		// so do not dial again and again; without the check, do not
		// risk a LISTEN through a pooler. Other errors (a backend
		// terminated, a server shutting down) pass: retried.
		l.noListen.Store(errNoPID)
		return
	case err != nil:
		return
	case pooled:
		l.noListen.Store(errPooled)
		b.stmt.sawPooler()
		return
	}
	lctx, cancel := b.rpc(ctx)
	_, err = c.Exec(lctx, "LISTEN "+pgx.Identifier{b.n.channel}.Sanitize())
	cancel()
	if err != nil {
		return
	}
	l.listening.Store(true)
	defer l.listening.Store(false)
	l.wakeAll()
	for {
		wctx, cancel := context.WithTimeout(ctx, listenCheck)
		n, err := c.WaitForNotification(wctx)
		quiet := wctx.Err() != nil
		cancel()
		switch {
		case err == nil:
			if n != nil {
				l.notify(n.Payload)
			}
			continue
		case ctx.Err() != nil || !quiet || c.IsClosed():
			return
		}
		// Silent for listenCheck: does the server still answer?
		pctx, cancel := b.rpc(ctx)
		err = c.Ping(pctx)
		cancel()
		if err != nil {
			return
		}
	}
}
