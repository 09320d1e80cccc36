// Statement mode: how pglock's statements run on the pool. Prepared
// statements where the pool reaches PostgreSQL directly; the unnamed
// statement, parsed and planned each time, where a pooler may sit in
// between or before that is known.

package pglock

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock/internal/background"
)

// stmtRecheck is how long a check of the pool that got no answer waits
// before it is tried again.
const stmtRecheck = 30 * time.Second

// stmtMode is the statement mode of a Locker's statements.
//
// A pool left on pgx's default, the statement cache, prepares named
// statements on its server sessions. Behind a transaction pooler
// (PgBouncer's transaction mode) a server session is shared with other
// clients, and the cache fails statements with "prepared statement
// stmtcache_... already exists". So pglock runs its statements as the
// unnamed statement (QueryExecModeExec: one round trip, but parsed and
// planned by the server each time, which for pglock's statements is most
// of their cost) until one connection of the pool showed that it reaches
// PostgreSQL directly, by the test the LISTEN connection uses (see
// pooledConn). From then on they use the cache. The test assumes what
// pgxpool does: every connection of a pool goes to the same place the
// same way. A pool configured with another mode keeps it.
type stmtMode struct {
	pool       *pgxpool.Pool
	configured pgx.QueryExecMode
	timeout    time.Duration

	direct   atomic.Bool  // a pool connection reached PostgreSQL directly
	pooled   atomic.Bool  // a pooler was seen: never the cache
	checking atomic.Bool  // a check runs
	next     atomic.Int64 // no check before this (unix ns)
}

func newStmtMode(pool *pgxpool.Pool, timeout time.Duration) *stmtMode {
	return &stmtMode{pool: pool, configured: pool.Config().ConnConfig.DefaultQueryExecMode, timeout: timeout}
}

// get is the mode of the next statement. Until the pool is known to
// reach PostgreSQL directly, it starts a check in the background (at
// most one at a time, and after a check that got no answer, not before
// stmtRecheck).
func (m *stmtMode) get() pgx.QueryExecMode {
	switch {
	case m.configured != pgx.QueryExecModeCacheStatement:
		return m.configured
	case m.direct.Load() && !m.pooled.Load():
		return pgx.QueryExecModeCacheStatement
	case !m.pooled.Load() && time.Now().UnixNano() >= m.next.Load() && m.checking.CompareAndSwap(false, true):
		background.Go(m.check)
	}
	return pgx.QueryExecModeExec
}

// unnamed is the mode of statements that never use the cache (the
// migrations' DDL, run once).
func (m *stmtMode) unnamed() pgx.QueryExecMode {
	if m.configured != pgx.QueryExecModeCacheStatement {
		return m.configured
	}
	return pgx.QueryExecModeExec
}

// sawPooler records that a connection with the pool's configuration
// reaches PostgreSQL through a pooler.
func (m *stmtMode) sawPooler() {
	m.pooled.Store(true)
	m.direct.Store(false)
}

// check tests one connection of the pool.
func (m *stmtMode) check() {
	defer m.checking.Store(false)
	ctx, cancel := context.WithTimeout(context.Background(), m.timeout)
	defer cancel()
	c, err := m.pool.Acquire(ctx)
	if err == nil {
		var pooled bool
		pooled, err = pooledConn(ctx, c.Conn())
		c.Release()
		var pe *pgconn.PgError
		switch {
		case errors.As(err, &pe) && (strings.HasPrefix(pe.Code, "42") || strings.HasPrefix(pe.Code, "0A")):
			// The server refused the check (see listenOnce): the same
			// answer each time, and no way to rule out a pooler.
			m.sawPooler()
			return
		case err != nil:
		case pooled:
			m.sawPooler()
			return
		default:
			if !m.pooled.Load() {
				m.direct.Store(true)
			}
			return
		}
	}
	m.next.Store(time.Now().Add(stmtRecheck).UnixNano())
}
