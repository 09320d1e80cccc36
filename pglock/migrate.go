// The schema: the names of a Locker's objects, and the versioned
// migrations embedded in the package, applied on first use or by Migrate
// (or by hand), recorded in dlock_schema_migrations.

package pglock

import (
	"context"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

//go:embed migrations/*.sql
var migrationFiles embed.FS

// MigrationsTable records the migrations applied, per component and
// table: ("leases:<table>", version).
const MigrationsTable = "dlock_schema_migrations"

// identRE is what WithTable accepts: an unquoted lower-case identifier,
// optionally schema-qualified, each part at most 48 bytes (so derived
// names such as "<table>_token_seq" stay under PostgreSQL's 63).
var identRE = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,47}(\.[a-z_][a-z0-9_]{0,47})?$`)

// names are the quoted SQL names of a Locker's objects.
type names struct {
	raw      string // as given: "dlock_leases" or "app.locks"
	table    string // quoted
	sequence string // quoted
	holders  string // quoted: the shared and limited holders
	writers  string // quoted: the waiting writers
	channel  string // the NOTIFY channel's name (unquoted: pg_notify's argument)
}

func namesFor(table string) (names, error) {
	if !identRE.MatchString(table) {
		return names{}, fmt.Errorf("%w: pglock: table name %q: want a lower-case identifier (optionally schema.table), at most 48 bytes a part", dlock.ErrInvalidOption, table)
	}
	parts := strings.Split(table, ".")
	seq := append(append([]string(nil), parts[:len(parts)-1]...), parts[len(parts)-1]+"_token_seq")
	return names{
		raw:      table,
		table:    pgx.Identifier(parts).Sanitize(),
		sequence: pgx.Identifier(seq).Sanitize(),
		holders:  pgx.Identifier(suffixed(parts, "_holders")).Sanitize(),
		writers:  pgx.Identifier(suffixed(parts, "_writers")).Sanitize(),
		channel:  channelFor(table),
	}, nil
}

// suffixed is parts with suffix added to the last (the table's) name.
func suffixed(parts []string, suffix string) []string {
	out := append([]string(nil), parts...)
	out[len(out)-1] += suffix
	return out
}

// maxIdentLen is PostgreSQL's longest identifier, in bytes (NAMEDATALEN -
// 1): pg_notify refuses a longer channel name, and LISTEN truncates one.
const maxIdentLen = 63

// channelFor names the NOTIFY channel of a table: "<table>_released" (a
// schema's dot made '_'), or, when that is longer than a channel name may
// be (pg_notify fails with "channel name too long", so every Release of a
// table named with two long parts would fail), "dlock_<hash of the
// table>_released".
func channelFor(table string) string {
	if c := strings.ReplaceAll(table, ".", "_") + "_released"; len(c) <= maxIdentLen {
		return c
	}
	sum := sha256.Sum256([]byte(table))
	return "dlock_" + hex.EncodeToString(sum[:12]) + "_released"
}

func (n names) channelName() string { return n.channel }

type migration struct {
	version int
	sql     string
}

func migrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, e := range entries {
		v, err := strconv.Atoi(strings.SplitN(e.Name(), "_", 2)[0])
		if err != nil {
			return nil, fmt.Errorf("pglock: migration %q has no version number", e.Name())
		}
		b, err := migrationFiles.ReadFile("migrations/" + e.Name())
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{v, string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	return ms, nil
}

// Migrate creates or upgrades the lease table (WithTable's, default
// DefaultTable), its token sequence and its holders and writers tables
// ("<table>_holders", "<table>_writers"): the migrations in the package's
// migrations directory not yet recorded in MigrationsTable, in one
// transaction serialized by a transaction-scoped advisory lock (so it is
// safe to run from many replicas at once, and through a transaction
// pooler). A Locker runs it on first use unless WithoutMigrate is given.
func Migrate(ctx context.Context, pool *pgxpool.Pool, opts ...Option) error {
	o := defaultOptions()
	driver.Apply(&o, opts)
	if pool == nil {
		return fmt.Errorf("%w: pglock.Migrate was given a nil pool", dlock.ErrNilClient)
	}
	if ctx == nil {
		return fmt.Errorf("%w: pglock.Migrate: nil context", dlock.ErrInvalidOption)
	}
	n, err := namesFor(o.table)
	if err != nil {
		return err
	}
	return migrate(ctx, pool, n, newStmtMode(pool, 0).unnamed())
}

// migrate applies the migrations not yet recorded, running every
// statement in mode (see stmtMode.unnamed).
func migrate(ctx context.Context, pool *pgxpool.Pool, n names, mode pgx.QueryExecMode) error {
	ms, err := migrations()
	if err != nil {
		return err
	}
	component := "leases:" + n.raw
	// Up to date already (the common case): one read, no DDL and no lock.
	// CREATE TABLE IF NOT EXISTS needs the privilege to create in the
	// schema even when the table exists: a role that may only use the
	// table an administrator made passes by this read alone.
	var applied int
	err = pool.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM "+MigrationsTable+" WHERE component = $1", mode, component).Scan(&applied)
	if err == nil && applied >= ms[len(ms)-1].version {
		return nil
	}
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock(hashtext('dlock_schema_migrations'))", mode); err != nil {
			return err
		}
		if _, err := tx.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+MigrationsTable+" (component text NOT NULL, version int NOT NULL, applied_at timestamptz NOT NULL DEFAULT clock_timestamp(), PRIMARY KEY (component, version))", mode); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, "SELECT coalesce(max(version), 0) FROM "+MigrationsTable+" WHERE component = $1", mode, component).Scan(&applied); err != nil {
			return err
		}
		for _, m := range ms {
			if m.version <= applied {
				continue
			}
			sql := strings.NewReplacer("{{table}}", n.table, "{{sequence}}", n.sequence, "{{holders}}", n.holders, "{{writers}}", n.writers).Replace(m.sql)
			if _, err := tx.Exec(ctx, sql, mode); err != nil {
				return fmt.Errorf("migration %d: %w", m.version, err)
			}
			if _, err := tx.Exec(ctx, "INSERT INTO "+MigrationsTable+" (component, version) VALUES ($1, $2)", mode, component, m.version); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		var pe *pgconn.PgError
		if errors.As(err, &pe) && pe.Code == "42501" { // insufficient_privilege
			return fmt.Errorf("dlock: pglock migrate %s: %w (the database user may not create the lease table: run pglock.Migrate, or the SQL in pglock/migrations, as a user who may; grant this one SELECT, INSERT and UPDATE on the table, SELECT, INSERT, UPDATE and DELETE on its _holders and _writers tables, USAGE on its sequence and SELECT on %s, or give WithoutMigrate)", n.raw, err, MigrationsTable)
		}
		return outage(fmt.Errorf("dlock: pglock migrate %s: %w", n.raw, explain(err)))
	}
	return nil
}

// ready creates the schema on first use (unless WithoutMigrate); a failure
// is retried by the next call.
func (b *backend) ready(ctx context.Context) error {
	if !b.migrate {
		return nil
	}
	b.mu.Lock()
	done := b.migrated
	b.mu.Unlock()
	if done {
		return nil
	}
	rctx, cancel := b.rpc(ctx)
	defer cancel()
	if err := migrate(rctx, b.pool, b.n, b.stmt.unnamed()); err != nil {
		return err
	}
	b.mu.Lock()
	b.migrated = true
	b.mu.Unlock()
	return nil
}
