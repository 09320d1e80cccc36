// Errors: which statement failures are outages (outage), what a user can
// do about the others (explain), and whether a call whose context ended
// met a silent server (answered, silent).

package pglock

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// outage marks err, a statement's error, as dlock.ErrUnavailable when
// PostgreSQL (or the pooler in front of it) could not be reached or
// dropped the connection: a refused or reset connection, a connection
// pgx already knew to be closed, or the server's own word that it cannot
// serve a connection now (SQLSTATE class 08, connection exception, which
// PgBouncer also uses when it cannot reach PostgreSQL; 53300,
// too_many_connections; 57P01-57P03, the server shutting down, crashed
// or starting; 25P03, the session ended by the server's
// idle-in-transaction timeout). The original error stays in the chain.
// Others pass unchanged.
func outage(err error) error {
	if driver.Unreachable(err) || errors.Is(err, pgconn.ErrConnClosed) {
		return dlock.Unavailable(err)
	}
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case strings.HasPrefix(pe.Code, "08"), pe.Code == "53300", pe.Code == "57P01", pe.Code == "57P02", pe.Code == "57P03",
			pe.Code == "25P03":
			return dlock.Unavailable(err)
		}
	}
	return err
}

// explain adds what to do to the PostgreSQL errors a user can fix.
func explain(err error) error {
	var pe *pgconn.PgError
	if !errors.As(err, &pe) {
		return err
	}
	switch pe.Code {
	case "42P01": // undefined_table
		return fmt.Errorf("%w (run pglock.Migrate, or the SQL in pglock/migrations by hand, or drop WithoutMigrate)", err)
	case "42703": // undefined_column
		return fmt.Errorf("%w (the lease tables predate pglock's latest migration: run pglock.Migrate, or the SQL in pglock/migrations by hand)", err)
	case "25006": // read_only_sql_transaction
		return fmt.Errorf("%w (the server is read-only: a hot standby? locks need the primary)", err)
	case "42501": // insufficient_privilege
		return fmt.Errorf("%w (the database user may not use the lease table or sequence)", err)
	}
	return err
}

// answerRecency: an attempt whose context ends reports the key held (as
// the engine does once it has seen a holder) only if PostgreSQL answered
// a statement of this Locker this recently; otherwise it reports that
// PostgreSQL did not answer (a hung server or stalled link, not a held
// key).
const answerRecency = time.Second

// answered records that a statement sent at sent was answered.
func (b *backend) answered(sent time.Time) {
	for {
		old := b.lastOK.Load()
		if sent.UnixNano() <= old || b.lastOK.CompareAndSwap(old, sent.UnixNano()) {
			return
		}
	}
}

// silent returns err, unless ctx ended and PostgreSQL has not answered for
// answerRecency: then an error that does not wrap the context's (the
// engine must report an outage, not a held key).
func (b *backend) silent(ctx context.Context, what string, err error) error {
	if ctx.Err() == nil {
		return err
	}
	last := b.lastOK.Load()
	if last == 0 {
		return fmt.Errorf("dlock: postgres %s: no answer from PostgreSQL yet (%v)", what, err)
	}
	since := time.Since(time.Unix(0, last))
	if since < answerRecency {
		return err
	}
	return fmt.Errorf("dlock: postgres %s: no answer from PostgreSQL in the last %v (%v)", what, since.Round(time.Millisecond), err)
}
