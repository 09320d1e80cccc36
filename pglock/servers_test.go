// The test servers: PostgreSQL databases of a test's own or on a server
// that tests share, PgBouncer in front of them, and pools on them.

package pglock_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/dlock-go/dlock/internal/testserver"
)

func TestMain(m *testing.M) { testserver.Main(m) }

// newPool returns a default pgxpool on dsn, closed when the test ends.
func newPool(t testing.TB, dsn string) *pgxpool.Pool {
	t.Helper()
	p, err := pgxpool.New(context.Background(), dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func escape(s string) string {
	out := []byte{}
	for i := 0; i < len(s); i++ {
		if s[i] == '\'' {
			out = append(out, '\'')
		}
		out = append(out, s[i])
	}
	return string(out)
}

// pgDB is a PostgreSQL database of one test's own, on a server that the
// test may share with others: DSN("") and Exec("", ...) name that
// database, not the server's "postgres".
type pgDB struct {
	*testserver.Postgres
	name   string
	shared bool // on the shared server (sharedPG)
}

// DSN is a connection URL for database db (the test's database if empty)
// as the superuser.
func (d *pgDB) DSN(db string) string {
	if db == "" {
		db = d.name
	}
	return d.Postgres.DSN(db)
}

// Exec runs SQL through psql as the superuser on database db (the test's
// database if empty).
func (d *pgDB) Exec(db, sql string) (string, error) {
	if db == "" {
		db = d.name
	}
	return d.Postgres.Exec(db, sql)
}

// ViaProxy is a connection URL for the test's database through a proxy
// (or any listener forwarding to the server) at addr.
func (d *pgDB) ViaProxy(addr string) string {
	return "postgres://" + testserver.PostgresUser + "@" + addr + "/" + d.name + "?sslmode=disable"
}

// bouncerDB is a PgBouncer in front of a pgDB's server; DSN("") names the
// test's database.
type bouncerDB struct {
	*testserver.PgBouncer
	name string
}

// DSN is a connection URL for database db (the test's database if empty)
// through PgBouncer.
func (b *bouncerDB) DSN(db string) string {
	if db == "" {
		db = b.name
	}
	return b.PgBouncer.DSN(db)
}

// ownPG starts a PostgreSQL server for t alone: for a test that pauses,
// restarts or reconfigures it, or looks at it as a whole (its roles, every
// backend, its log). The test's database is "postgres".
func ownPG(t *testing.T) *pgDB {
	t.Helper()
	return &pgDB{Postgres: testserver.StartPostgres(t), name: "postgres"}
}

// The PostgreSQL server, and the PgBouncer in front of it, that tests
// share which need neither a server of their own nor its whole state:
// each gets a database of its own (sharedPG). Starting PostgreSQL (a
// copy of the initdb template, then the server) costs more than most
// tests that use it.
func sharedPostgres(t *testing.T) *testserver.Postgres {
	t.Helper()
	return testserver.Shared(t, "postgres", func(tb testserver.TB) *testserver.Postgres {
		return testserver.StartPostgres(tb)
	})
}

// dbs counts the databases made on the shared server, for their names.
var dbs atomic.Int64

// sharedPG returns a fresh database for t on the shared server.
func sharedPG(t *testing.T) *pgDB {
	t.Helper()
	pg := sharedPostgres(t)
	name := fmt.Sprintf("t%d_%s", dbs.Add(1), dbSafe(t.Name()))
	if _, err := pg.Exec("", "CREATE DATABASE "+name); err != nil {
		t.Fatalf("database of the test: %v", err)
	}
	return &pgDB{Postgres: pg, name: name, shared: true}
}

// bouncerFor returns a PgBouncer in transaction pooling mode in front of
// d's server: the shared one (started once) if d is on the shared server,
// else one of t's own.
func bouncerFor(t *testing.T, d *pgDB) *bouncerDB {
	t.Helper()
	if !d.shared {
		return &bouncerDB{PgBouncer: testserver.StartPgBouncer(t, d.Postgres), name: d.name}
	}
	pb := testserver.Shared(t, "pgbouncer", func(tb testserver.TB) *testserver.PgBouncer {
		return testserver.StartPgBouncer(tb, sharedPostgres(t))
	})
	return &bouncerDB{PgBouncer: pb, name: d.name}
}

// dbSafe turns a test name into the rest of a database name (lower case
// letters, digits and underscores, within PostgreSQL's 63 bytes).
func dbSafe(name string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(name) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	s := b.String()
	if len(s) > 40 {
		s = s[:40]
	}
	return s
}
