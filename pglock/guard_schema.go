// The guard's tables: their names (WithGuardTable), their DDL and
// MigrateGuard, which creates them.

package pglock

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// DefaultGuardTable is the table in which a Guard keeps the highest fence
// of each resource unless WithGuardTable says otherwise. Its named values
// are in the table of the same name followed by GuardValuesSuffix
// ("dlock_fences_values").
const DefaultGuardTable = "dlock_fences"

// GuardValuesSuffix is appended to the guard's table name to name the
// table of its values (Put and Get).
const GuardValuesSuffix = "_values"

// GuardSharedSuffix is appended to the guard's table name to name the
// table of the shared fences' tokens each resource admitted above its
// last exclusive fence ("dlock_fences_shared").
const GuardSharedSuffix = "_shared"

// maxGuardIdentLen is PostgreSQL's limit on an identifier's length in bytes
// (NAMEDATALEN - 1): longer names are truncated by the server, so two
// long names could end up the same table.
const maxGuardIdentLen = 63

type guardOptions struct {
	table string
}

// WithGuardTable makes a Guard (and MigrateGuard) keep its fences in table
// name, its values in name+GuardValuesSuffix and its shared fences'
// tokens in name+GuardSharedSuffix, instead of DefaultGuardTable. name is "table" or "schema.table" (the schema must
// exist); each part starts with a lowercase ASCII letter or '_' and goes on
// with lowercase ASCII letters, digits and '_', and the table part leaves
// room for the suffix within PostgreSQL's 63 bytes. Any other name,
// including "", makes every call of the Guard, and MigrateGuard, fail with
// an error wrapping dlock.ErrInvalidOption. An unqualified name is found
// through the connection's search_path. Guards exclude each other only
// when they use the same tables.
func WithGuardTable(name string) Option {
	return driver.Setting(func(o *guardOptions) { o.table = name })
}

// guardTables are the guard's three tables, as quoted identifiers.
type guardTables struct {
	name   string // as configured: "dlock_fences", "app.fences"
	fences string // `"dlock_fences"`, `"app"."fences"`
	values string // `"dlock_fences_values"`
	shared string // `"dlock_fences_shared"`
}

// parseGuardTable validates name (see WithGuardTable) and returns the
// quoted identifiers of the guard's tables.
func parseGuardTable(name string) (guardTables, error) {
	parts := strings.Split(name, ".")
	bad := func(why string) (guardTables, error) {
		return guardTables{}, fmt.Errorf("%w: pglock guard: table name %q %s", dlock.ErrInvalidOption, name, why)
	}
	if len(parts) > 2 {
		return bad("has more than one '.' (want \"table\" or \"schema.table\")")
	}
	for _, p := range parts {
		if !validGuardIdent(p) {
			return bad("is not one or two dot-separated identifiers of lowercase ASCII letters, digits and '_', not starting with a digit")
		}
	}
	table := parts[len(parts)-1]
	suffix := max(len(GuardValuesSuffix), len(GuardSharedSuffix))
	if len(parts[0]) > maxGuardIdentLen || len(table)+suffix > maxGuardIdentLen {
		return bad(fmt.Sprintf("is too long (the table part is at most %d bytes, the schema %d)", maxGuardIdentLen-suffix, maxGuardIdentLen))
	}
	fences := pgx.Identifier(parts)
	values := append(pgx.Identifier{}, parts...)
	values[len(values)-1] += GuardValuesSuffix
	shared := append(pgx.Identifier{}, parts...)
	shared[len(shared)-1] += GuardSharedSuffix
	return guardTables{name: name, fences: fences.Sanitize(), values: values.Sanitize(), shared: shared.Sanitize()}, nil
}

// validGuardIdent reports whether s is a lowercase SQL identifier that needs no
// quoting: [a-z_][a-z0-9_]*.
func validGuardIdent(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c == '_':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return true
}

// maxGuardToken is the largest token, the CHECK bound of the token column.
const maxGuardToken = "18446744073709551615"

// ddl returns the statements creating the guard's tables. Tokens are
// numeric(20,0) rather than bigint, so that every uint64 token (dlock's
// tokens are unsigned) is kept and compared exactly. Resources and names
// use the "C" collation: byte-wise equality and ordering, whatever the
// database's default collation. A fence row with token 0 (and an empty owner)
// is a resource that has recorded no exclusive fence yet.
func (t guardTables) ddl() (fences, values, shared []string) {
	fences = []string{
		`CREATE TABLE IF NOT EXISTS ` + t.fences + ` (
	resource text COLLATE "C" PRIMARY KEY,
	token numeric(20,0) NOT NULL CHECK (token >= 0 AND token <= ` + maxGuardToken + `),
	owner text NOT NULL
)`,
		`COMMENT ON TABLE ` + t.fences + ` IS 'dlock pglock.Guard: the highest exclusive fence (token, owner) each resource accepted; token 0: none yet. Created by pglock.MigrateGuard.'`,
	}
	values = []string{
		`CREATE TABLE IF NOT EXISTS ` + t.values + ` (
	resource text COLLATE "C" NOT NULL,
	name text COLLATE "C" NOT NULL,
	value bytea NOT NULL,
	PRIMARY KEY (resource, name)
)`,
		`COMMENT ON TABLE ` + t.values + ` IS 'dlock pglock.Guard: the values of Guard.Put, fenced by the table without the _values suffix. Created by pglock.MigrateGuard.'`,
	}
	shared = []string{
		`CREATE TABLE IF NOT EXISTS ` + t.shared + ` (
	resource text COLLATE "C" NOT NULL,
	token numeric(20,0) NOT NULL CHECK (token > 0 AND token <= ` + maxGuardToken + `),
	PRIMARY KEY (resource, token)
)`,
		`COMMENT ON TABLE ` + t.shared + ` IS 'dlock pglock.Guard: tokens of shared fences each resource admitted above its last exclusive fence (the table without the _shared suffix); deleted when an exclusive fence above them is admitted. Created by pglock.MigrateGuard.'`,
	}
	return fences, values, shared
}

// Column types MigrateGuard checks an existing table against.
const (
	guardOIDBytea   = 17
	guardOIDText    = 25
	guardOIDNumeric = 1700
)

// MigrateGuard creates the guard's tables (DefaultGuardTable and its values
// table, or those of WithGuardTable) if they do not exist, and checks that
// existing ones have the columns a Guard uses. It is idempotent and safe
// to run concurrently from many processes: it runs in one transaction
// serialized by a transaction-scoped advisory lock
// (pg_advisory_xact_lock), so it needs no session state and works through
// PgBouncer in transaction mode. It needs the privilege to create tables
// in the schema; the Guard then needs SELECT, INSERT and UPDATE on the
// fence and values tables, and SELECT, INSERT and DELETE on the shared
// fences' table. It needs PostgreSQL 11 or later (as the Guard does). Other
// options are ignored. A nil pool is an error wrapping
// dlock.ErrNilClient; an invalid table name or a nil ctx, one wrapping
// dlock.ErrInvalidOption.
func MigrateGuard(ctx context.Context, pool *pgxpool.Pool, opts ...Option) error {
	if ctx == nil {
		return fmt.Errorf("%w: pglock.MigrateGuard: nil context", dlock.ErrInvalidOption)
	}
	o := guardOptions{table: DefaultGuardTable}
	driver.Apply(&o, opts)
	t, err := parseGuardTable(o.table)
	if err != nil {
		return err
	}
	if pool == nil {
		return fmt.Errorf("%w: pglock.MigrateGuard was given a nil pool", dlock.ErrNilClient)
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// hashtextextended is the server's own 64-bit string hash (PostgreSQL 11+).
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock(hashtextextended($1, 0))`, "dlock pglock.MigrateGuard "+t.fences); err != nil {
			return err
		}
		fences, values, shared := t.ddl()
		for _, tbl := range []struct {
			name string
			ddl  []string
		}{{t.fences, fences}, {t.values, values}, {t.shared, shared}} {
			var exists bool
			if err := tx.QueryRow(ctx, `SELECT to_regclass($1) IS NOT NULL`, tbl.name).Scan(&exists); err != nil {
				return err
			}
			if exists {
				continue
			}
			for _, stmt := range tbl.ddl {
				if _, err := tx.Exec(ctx, stmt); err != nil {
					return err
				}
			}
		}
		return t.checkColumns(ctx, tx)
	})
	if err != nil {
		return fmt.Errorf("dlock: pglock.MigrateGuard (table %s): %w", t.name, err)
	}
	return nil
}

// errNotGuardTable says an existing table does not have the guard's
// columns.
var errNotGuardTable = errors.New("not a table pglock.MigrateGuard made (drop it, or choose another one with WithGuardTable)")

// checkColumns checks that the guard's tables have its columns, of its
// types.
func (t guardTables) checkColumns(ctx context.Context, tx pgx.Tx) error {
	for _, c := range []struct {
		table string
		cols  string
		oids  []uint32
	}{
		{t.fences, "resource, token, owner", []uint32{guardOIDText, guardOIDNumeric, guardOIDText}},
		{t.values, "resource, name, value", []uint32{guardOIDText, guardOIDText, guardOIDBytea}},
		{t.shared, "resource, token", []uint32{guardOIDText, guardOIDNumeric}},
	} {
		rows, err := tx.Query(ctx, `SELECT `+c.cols+` FROM `+c.table+` LIMIT 0`)
		if err != nil {
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "42703" { // undefined_column
				return fmt.Errorf("table %s: %w: %w", c.table, errNotGuardTable, err)
			}
			return err
		}
		fds := rows.FieldDescriptions()
		got := make([]uint32, len(fds))
		for i, fd := range fds {
			got[i] = fd.DataTypeOID
		}
		rows.Close()
		if err := rows.Err(); err != nil {
			return err
		}
		if fmt.Sprint(got) != fmt.Sprint(c.oids) {
			return fmt.Errorf("table %s: columns (%s) have types %v, want %v: %w", c.table, c.cols, got, c.oids, errNotGuardTable)
		}
	}
	return nil
}
