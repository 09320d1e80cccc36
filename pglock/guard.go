// The fencing guard on PostgreSQL: a resource's highest accepted fence in
// a row, checked and advanced inside the caller's own transaction.

package pglock

import (
	"context"
	"errors"
	"fmt"
	"math/big"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/guard"
)

// maxGuardRowAttempts bounds Check's loop of reading the fence row and,
// when the resource has none, inserting it: the second read finds the row
// unless it is deleted concurrently.
const maxGuardRowAttempts = 3

// Guard is a fencing guard on PostgreSQL (a guard.Guard) made to fence
// writes where they happen: in the database, in the writer's own
// transaction. Check verifies a lock holder's dlock.Fence for a resource
// and records it, inside the transaction that makes the protected change,
// so the change commits only with an admitted fence:
//
//	tx, _ := pool.Begin(ctx)
//	defer tx.Rollback(ctx)
//	if err := g.Check(ctx, tx, "sku:42", lock.Fence()); err != nil {
//		return err // a *dlock.StaleTokenError when a newer holder came first
//	}
//	tx.Exec(ctx, "UPDATE inventory SET qty = qty - 1 WHERE sku = 42")
//	return tx.Commit(ctx)
//
// Do wraps the same steps; Put and Get keep named values in the guard's
// own table (MigrateGuard creates its tables), each in a transaction of
// its own. Fenced transactions on one resource commit in fence order, a
// refused Check aborts its transaction, and fences are durable rows that
// every Guard on the same tables respects. Only writes in a checked
// transaction are fenced, and a checked transaction blocks the next
// holder's Check until it ends. The storage, how Check works, and the
// Guard's full Guarantees and Not guaranteed (isolation levels, the
// Guard's pool, read-only transactions) are in docs/pglock.md.
type Guard struct {
	pool   *pgxpool.Pool
	chk    guard.Checker
	tables guardTables
	err    error // NewGuard's failure: every call returns it
}

var _ guard.Guard = (*Guard)(nil)

// NewGuard returns a Guard on pool's database, configured by opts:
// WithGuardTable (default DefaultGuardTable) and dlock.WithObserver
// (refusals are reported with Backend "postgres"); other options are
// ignored. Its tables must exist: run MigrateGuard with the same
// WithGuardTable once (at deployment or start-up); a call on missing
// tables fails with an error that says so.
//
// A nil pool gives a Guard whose every call fails with an error wrapping
// dlock.ErrNilClient, as does the zero Guard; an invalid table name, one
// wrapping dlock.ErrInvalidOption. Those errors come after the argument
// checks of guard.Checker.Validate.
func NewGuard(pool *pgxpool.Pool, opts ...Option) *Guard {
	o := guardOptions{table: DefaultGuardTable}
	driver.Apply(&o, opts)
	g := &Guard{pool: pool, chk: guard.NewChecker("postgres", opts)}
	g.tables, g.err = parseGuardTable(o.table)
	if g.err == nil && pool == nil {
		g.err = fmt.Errorf("%w: pglock.NewGuard was given a nil pool", dlock.ErrNilClient)
	}
	return g
}

// errZeroPgGuard is the error of every call of a Guard not made by NewGuard.
var errZeroPgGuard = fmt.Errorf("%w: zero pglock.Guard (use NewGuard)", dlock.ErrNilClient)

// check validates a call's arguments, then reports NewGuard's failure, or
// the zero Guard's.
func (g *Guard) check(ctx context.Context, resource string, names ...string) error {
	if g == nil {
		return errZeroPgGuard
	}
	if err := g.chk.Validate(ctx, resource, names...); err != nil {
		return err
	}
	if g.err != nil {
		return g.err
	}
	if g.pool == nil {
		return errZeroPgGuard
	}
	return nil
}

// checkOwner refuses an owner over guard.MaxOwnerLen, or one
// PostgreSQL's text cannot hold.
func (g *Guard) checkOwner(resource string, f dlock.Fence) error {
	if err := g.chk.ValidateFence(f); err != nil {
		return err
	}
	if !utf8.ValidString(f.Owner) || strings.IndexByte(f.Owner, 0) >= 0 {
		return fmt.Errorf("%w: postgres guard %q: the fence's owner %q is not valid UTF-8 without NUL", dlock.ErrInvalidOption, resource, f.Owner)
	}
	return nil
}

// Check checks f for resource inside tx and records it, as the first step
// of a fenced transaction (see Guard): if f is admitted, it returns nil
// and tx holds the resource's fence row locked until it ends, so whatever
// tx changes commits only with f admitted; commit tx to keep the fence
// and the changes together. If f is refused, it returns a
// *dlock.StaleTokenError (errors.Is dlock.ErrStaleToken) and aborts tx:
// roll it back.
//
// tx must be on the database that holds the guard's tables. Under READ
// COMMITTED (PostgreSQL's default) the Guard's pool is not used; an
// exclusive Check under REPEATABLE READ or SERIALIZABLE also reads, with
// the fence row locked, on a connection of the Guard's pool, which must
// reach the same primary, database and tables (see the Guard's Not
// guaranteed in docs/pglock.md). Check may be called again in tx, for the same resource
// or others (in a consistent order across transactions). Other failures
// (the server's, a context that ended, a read-only transaction) leave tx
// in whatever state the failed statement left it: roll it back.
//
// A nil tx is an error wrapping dlock.ErrInvalidOption; a nil pool given to
// NewGuard, dlock.ErrNilClient.
func (g *Guard) Check(ctx context.Context, tx pgx.Tx, resource string, f dlock.Fence) error {
	if err := g.check(ctx, resource); err != nil {
		return err
	}
	if isNilTx(tx) {
		return fmt.Errorf("%w: postgres guard %q: nil transaction", dlock.ErrInvalidOption, resource)
	}
	if err := g.checkOwner(resource, f); err != nil {
		return err
	}
	err := g.checkTx(ctx, tx, resource, f)
	if errors.Is(err, dlock.ErrStaleToken) {
		abortGuardTx(ctx, tx)
	}
	return err
}

// isNilTx reports a nil tx, also a nil pointer of a concrete type in the
// interface (a *pgxpool.Tx left nil by a failed Begin), whose methods
// would panic.
func isNilTx(tx pgx.Tx) bool {
	if tx == nil {
		return true
	}
	v := reflect.ValueOf(tx)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// guardAbortStmt raises an error, which aborts the transaction it runs in.
const guardAbortStmt = `DO $$BEGIN RAISE EXCEPTION 'dlock: pglock.Guard.Check refused a stale fencing token: this transaction must roll back'; END$$`

// abortGuardTx aborts tx after a refused Check, so that it cannot commit: the
// statement fails by design, with a server error. If it could not reach
// the server (ctx ended, a broken connection), the connection is closed,
// which aborts tx on the server just as well.
func abortGuardTx(ctx context.Context, tx pgx.Tx) {
	var pgErr *pgconn.PgError
	if ctx.Err() == nil {
		_, err := tx.Exec(ctx, guardAbortStmt)
		if errors.As(err, &pgErr) {
			return
		}
	}
	if c := tx.Conn(); c != nil && c.PgConn() != nil {
		_ = c.PgConn().Close(ctx)
	}
}

// checkTx is Check on valid arguments: it locks resource's fence row,
// applies the rule and records what it changes. A refusal returns the
// Checker's *dlock.StaleTokenError and leaves tx as it is.
//
// A shared fence locks the fence row FOR SHARE (shared checks wait for
// nobody but a writer) and, admitted, inserts its token into the shared
// table without reading it: rows of distinct tokens never conflict, and
// under SERIALIZABLE no shared check depends on another's writes. Under
// READ COMMITTED it also deletes the rows below its own token that no one
// else holds, so a key that only ever has shared holders keeps few rows.
// An exclusive fence locks the fence row FOR NO KEY UPDATE, which waits
// until every transaction of a shared check on the resource has ended,
// and then reads the highest shared token in a statement of its own,
// whose snapshot has their rows under READ COMMITTED; under REPEATABLE
// READ or SERIALIZABLE, whose snapshot may not, it reads them once more
// on a connection of the Guard's pool (sharedSince). Admitted above the
// last exclusive fence, it updates the fence row and deletes the shared
// tokens it is above (all it can see: under REPEATABLE READ or
// SERIALIZABLE rows committed after its snapshot stay, below it,
// harmless).
func (g *Guard) checkTx(ctx context.Context, tx pgx.Tx, resource string, f dlock.Fence) error {
	lock := " FOR NO KEY UPDATE"
	if f.Shared {
		lock = " FOR SHARE"
	}
	sel := `SELECT token::text, owner, current_setting('transaction_isolation') FROM ` + g.tables.fences + ` WHERE resource = $1` + lock
	for attempt := 0; attempt < maxGuardRowAttempts; attempt++ {
		var tok, owner, iso string
		err := tx.QueryRow(ctx, sel, resource).Scan(&tok, &owner, &iso)
		if errors.Is(err, pgx.ErrNoRows) {
			// No fence row yet: insert one with no fence, then lock it.
			// A concurrent insert of the same row makes this one wait for
			// that transaction's end, then do nothing.
			_, err = tx.Exec(ctx, `INSERT INTO `+g.tables.fences+` (resource, token, owner) VALUES ($1, 0, '') ON CONFLICT (resource) DO NOTHING`, resource)
			if err != nil {
				return g.dbError(ctx, resource, err)
			}
			continue
		}
		if err != nil {
			return g.dbError(ctx, resource, err)
		}
		// READ UNCOMMITTED runs as READ COMMITTED in PostgreSQL.
		readCommitted := iso == "read committed" || iso == "read uncommitted"
		seen := "0"
		switch {
		case f.Shared:
		case readCommitted:
			// The snapshot of the locking statement predates the wait for
			// the lock: read the shared tokens in a statement of its own.
			q := `SELECT coalesce(max(token), 0)::text FROM ` + g.tables.shared + ` WHERE resource = $1`
			if err := tx.QueryRow(ctx, q, resource).Scan(&seen); err != nil {
				return g.dbError(ctx, resource, err)
			}
		default:
			if seen, err = g.sharedSince(ctx, tx, resource, iso); err != nil {
				return err
			}
		}
		rec, err := parseFenceRow(tok, owner, seen)
		if err != nil {
			return fmt.Errorf("dlock: postgres guard %q: the fence row in %s holds token %q owner %q (highest shared token %q): %w", resource, g.tables.name, tok, owner, seen, err)
		}
		next, err := g.chk.Check(resource, rec, f)
		if err != nil {
			return err
		}
		switch {
		case f.Shared && readCommitted:
			_, err = tx.Exec(ctx, `WITH gone AS (
	DELETE FROM `+g.tables.shared+` WHERE ctid IN (
		SELECT ctid FROM `+g.tables.shared+` WHERE resource = $1 AND token < $2 FOR UPDATE SKIP LOCKED))
INSERT INTO `+g.tables.shared+` (resource, token) VALUES ($1, $2) ON CONFLICT DO NOTHING`, resource, guardNumericToken(f.Token))
		case f.Shared:
			_, err = tx.Exec(ctx, `INSERT INTO `+g.tables.shared+` (resource, token) VALUES ($1, $2) ON CONFLICT DO NOTHING`, resource, guardNumericToken(f.Token))
		case next != rec:
			_, err = tx.Exec(ctx, `WITH d AS (DELETE FROM `+g.tables.shared+` WHERE resource = $1 AND token <= $2)
UPDATE `+g.tables.fences+` SET token = $2, owner = $3 WHERE resource = $1`, resource, guardNumericToken(next.Exclusive.Token), next.Exclusive.Owner)
		}
		if err != nil {
			return g.dbError(ctx, resource, err)
		}
		return nil
	}
	return fmt.Errorf("dlock: postgres guard %q: the fence row in %s kept disappearing (deleted concurrently %d times)", resource, g.tables.name, maxGuardRowAttempts)
}

// sharedSince returns the highest shared token of resource for an
// exclusive Check under REPEATABLE READ or SERIALIZABLE, whose
// transaction's snapshot can predate shared checks that committed while
// it waited for the fence row. With the row locked no shared check can
// commit any more, so the tokens are read once more outside the
// transaction, on a connection of the Guard's pool, which must reach the
// same server, database and table (checked: otherwise the Check fails).
func (g *Guard) sharedSince(ctx context.Context, tx pgx.Tx, resource, iso string) (string, error) {
	q := `SELECT coalesce(max(token), 0)::text, current_database() || ' ' || coalesce(to_regclass($2)::oid::text, '-') || ' ' || (extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint::text, pg_is_in_recovery() FROM ` + g.tables.shared + ` WHERE resource = $1`
	var inTx, txWhere string
	var replica bool
	if err := tx.QueryRow(ctx, q, resource, g.tables.shared).Scan(&inTx, &txWhere, &replica); err != nil {
		return "", g.dbError(ctx, resource, err)
	}
	c, err := g.pool.Acquire(ctx)
	if err != nil {
		if cerr := ctx.Err(); cerr != nil {
			st := g.pool.Stat()
			return "", fmt.Errorf("%w: postgres guard %q: no connection of the Guard's pool came free (%d of %d in use) for an exclusive Check under %s, which reads the shared fences outside its transaction (a transaction waiting for this one's fence row may hold the last one): %w",
				dlock.ErrUnavailable, resource, st.AcquiredConns(), st.MaxConns(), iso, errors.Join(cerr, err))
		}
		return "", g.dbError(ctx, resource, err)
	}
	defer c.Release()
	var now, poolWhere string
	if err := c.QueryRow(ctx, q, resource, g.tables.shared).Scan(&now, &poolWhere, &replica); err != nil {
		return "", g.dbError(ctx, resource, err)
	}
	if poolWhere != txWhere || replica {
		return "", fmt.Errorf("%w: postgres guard %q: an exclusive Check under %s reads the shared fences on the Guard's pool, which reaches another server, database or table %s than the transaction (%q, replica %v, against %q): give NewGuard a pool of the transaction's primary and search_path, or check under READ COMMITTED",
			dlock.ErrInvalidOption, resource, iso, g.tables.shared, poolWhere, replica, txWhere)
	}
	return maxDecimal(inTx, now), nil
}

// maxDecimal returns the larger of two non-negative integers in decimal
// without leading zeros (numeric::text of a token).
func maxDecimal(a, b string) string {
	if len(a) != len(b) {
		if len(a) > len(b) {
			return a
		}
		return b
	}
	return max(a, b)
}

// errBadFenceRow reports a fence row that does not hold a fence.
var errBadFenceRow = errors.New("not a fence (delete the row to reset the resource's fences)")

// parseFenceRow returns the record of a fence row; token 0 is no
// exclusive fence recorded yet.
func parseFenceRow(tok, owner, seen string) (dlock.FenceRecord, error) {
	t, err := strconv.ParseUint(tok, 10, 64)
	if err != nil {
		return dlock.FenceRecord{}, errBadFenceRow
	}
	s, err := strconv.ParseUint(seen, 10, 64)
	if err != nil {
		return dlock.FenceRecord{}, errBadFenceRow
	}
	if t == 0 {
		return dlock.FenceRecord{Seen: s}, nil
	}
	return dlock.FenceRecord{Exclusive: dlock.Fence{Token: t, Owner: owner}, Seen: max(s, t)}, nil
}

// guardNumericToken is a token as a numeric parameter: every uint64, exactly.
func guardNumericToken(t uint64) pgtype.Numeric {
	return pgtype.Numeric{Int: new(big.Int).SetUint64(t), Valid: true}
}

// guardNoAnswer describes a call its context ended.
const guardNoAnswer = "no answer before the context ended (a hung server or link, or a wait for the fence row while another transaction holds it)"

// dbError wraps a failure of the server or the connection with what the
// caller needs to know: the context ended (dlock.ErrUnavailable), the
// transaction is read-only (dlock.ErrUnsupported), the tables are missing
// (run MigrateGuard).
func (g *Guard) dbError(ctx context.Context, resource string, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		if errors.Is(err, cerr) {
			return fmt.Errorf("%w: postgres guard %q: %s: %w", dlock.ErrUnavailable, resource, guardNoAnswer, err)
		}
		return fmt.Errorf("%w: postgres guard %q: %s: %w", dlock.ErrUnavailable, resource, guardNoAnswer, errors.Join(cerr, err))
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		switch pgErr.Code {
		case "25006": // read_only_sql_transaction
			return fmt.Errorf("%w: postgres guard %q: a fence check records the fence, so it needs a read-write transaction on the primary, not a read-only transaction or a replica: %w", dlock.ErrUnsupported, resource, err)
		case "42P01", "42703", "42P10": // undefined_table, undefined_column, invalid_column_reference (no unique index for ON CONFLICT)
			return fmt.Errorf("dlock: postgres guard %q: the guard's tables (%s, %s and %s) are missing or not as pglock.MigrateGuard makes them: run pglock.MigrateGuard with the same WithGuardTable first: %w", resource, g.tables.fences, g.tables.values, g.tables.shared, err)
		}
	}
	return fmt.Errorf("dlock: postgres guard %q: %w", resource, err)
}

// Do runs fn in a fenced transaction: it begins a transaction on the
// Guard's pool, runs Check in it, then fn, and commits. If f is refused,
// fn does not run and Do returns the *dlock.StaleTokenError. If fn returns
// an error (or panics), the transaction rolls back, the fence with it, and
// the error is returned as is (the panic goes on). A failed commit returns
// an error; errors.Is(err, pgx.ErrTxCommitRollback) when a statement of fn
// had failed and fn ignored it.
//
// Unlike guard.Doer's Do, fn's database work is part of the fenced
// transaction: fn must do it through tx (not through the Guard's pool, or
// the Guard's other methods on the same resource, which would wait for tx
// to end). A nil fn is an error wrapping dlock.ErrInvalidOption.
func (g *Guard) Do(ctx context.Context, resource string, f dlock.Fence, fn func(ctx context.Context, tx pgx.Tx) error) error {
	if err := g.check(ctx, resource); err != nil {
		return err
	}
	if fn == nil {
		return fmt.Errorf("%w: postgres guard %q: nil function", dlock.ErrInvalidOption, resource)
	}
	if err := g.checkOwner(resource, f); err != nil {
		return err
	}
	var fnErr error
	err := g.inTx(ctx, resource, f, func(tx pgx.Tx) error {
		fnErr = fn(ctx, tx)
		return fnErr
	})
	if fnErr != nil {
		return fnErr
	}
	return err
}

// inTx runs op in a transaction of its own after checking f, and commits.
// A refusal, or op's error, rolls back and returns the error as is.
func (g *Guard) inTx(ctx context.Context, resource string, f dlock.Fence, op func(tx pgx.Tx) error) (err error) {
	// READ COMMITTED whatever the server's default: a higher level gains
	// these statements nothing and would cost the check a second
	// connection of the pool (see sharedSince).
	tx, err := g.pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.ReadCommitted})
	if err != nil {
		return g.dbError(ctx, resource, err)
	}
	committed := false
	defer func() {
		if !committed {
			// With ctx ended, the rollback fails and pgx closes the
			// connection: the server rolls back.
			_ = tx.Rollback(ctx)
		}
	}()
	if err := g.checkTx(ctx, tx, resource, f); err != nil {
		return err
	}
	if err := op(tx); err != nil {
		return err
	}
	committed = true
	if err := tx.Commit(ctx); err != nil {
		return g.dbError(ctx, resource, fmt.Errorf("commit: %w", err))
	}
	return nil
}

// Put implements guard.Guard: one transaction checks f (as Check does)
// and sets name to value in the values table.
func (g *Guard) Put(ctx context.Context, resource string, f dlock.Fence, name, value string) error {
	if err := g.check(ctx, resource, name); err != nil {
		return err
	}
	if err := g.checkOwner(resource, f); err != nil {
		return err
	}
	return g.inTx(ctx, resource, f, func(tx pgx.Tx) error {
		_, err := tx.Exec(ctx, `INSERT INTO `+g.tables.values+` (resource, name, value) VALUES ($1, $2, $3)
ON CONFLICT (resource, name) DO UPDATE SET value = EXCLUDED.value`, resource, name, []byte(value))
		if err != nil {
			return g.dbError(ctx, resource, err)
		}
		return nil
	})
}

// Get implements guard.Guard: one transaction checks f (as Check does),
// reads name from the values table and commits (a fenced read: once it
// succeeds with an exclusive fence, older fences can no longer write). ok
// is false when name was never Put.
func (g *Guard) Get(ctx context.Context, resource string, f dlock.Fence, name string) (value string, ok bool, err error) {
	if err := g.check(ctx, resource, name); err != nil {
		return "", false, err
	}
	if err := g.checkOwner(resource, f); err != nil {
		return "", false, err
	}
	err = g.inTx(ctx, resource, f, func(tx pgx.Tx) error {
		var v []byte
		err := tx.QueryRow(ctx, `SELECT value FROM `+g.tables.values+` WHERE resource = $1 AND name = $2`, resource, name).Scan(&v)
		switch {
		case errors.Is(err, pgx.ErrNoRows):
			value, ok = "", false
		case err != nil:
			return g.dbError(ctx, resource, err)
		default:
			value, ok = string(v), true
		}
		return nil
	})
	if err != nil {
		return "", false, err
	}
	return value, ok, nil
}

// Highest implements guard.Guard: one read of resource's fence row,
// without locking it (the last committed fence).
func (g *Guard) Highest(ctx context.Context, resource string) (dlock.Fence, error) {
	if err := g.check(ctx, resource); err != nil {
		return dlock.Fence{}, err
	}
	var tok, owner string
	err := g.pool.QueryRow(ctx, `SELECT token::text, owner FROM `+g.tables.fences+` WHERE resource = $1`, resource).Scan(&tok, &owner)
	if errors.Is(err, pgx.ErrNoRows) {
		return dlock.Fence{}, nil
	}
	if err != nil {
		return dlock.Fence{}, g.dbError(ctx, resource, err)
	}
	rec, err := parseFenceRow(tok, owner, "0")
	if err != nil {
		return dlock.Fence{}, fmt.Errorf("dlock: postgres guard %q: the fence row in %s holds token %q owner %q: %w", resource, g.tables.name, tok, owner, err)
	}
	return rec.Exclusive, nil
}
