package pglock_test

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"

	"github.com/dlock-go/dlock/internal/testserver"
)

// pgDB is a PostgreSQL database of one test's own, on a server that the
// test may share with others: DSN("") and Exec("", ...) name that
// database, not the server's "postgres".
type pgDB struct {
	*testserver.Postgres
	name string
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

// shared is the PostgreSQL server, and the PgBouncer in front of it, that
// tests share which need neither a server of their own nor its whole
// state: each gets a database of its own (sharedPG). Starting PostgreSQL
// (initdb, then the server) costs more than most tests that use it. The
// server starts with the first test that asks for it and is stopped when
// the last test holding it ends, so none of its goroutines outlives the
// tests.
var shared struct {
	mu   sync.Mutex
	refs int
	dbs  int // databases created, for their names
	tb   *sharedTB
	pg   *testserver.Postgres
	pb   *testserver.PgBouncer
}

// sharedPG returns a fresh database for t on the shared server, which t
// holds until it ends.
func sharedPG(t *testing.T) *pgDB {
	t.Helper()
	shared.mu.Lock()
	if shared.refs == 0 {
		tb := &sharedTB{}
		var pg *testserver.Postgres
		if !tb.run(func() { pg = testserver.StartPostgres(tb) }) {
			tb.stop()
			shared.mu.Unlock()
			tb.report(t)
			t.FailNow()
		}
		shared.tb, shared.pg, shared.pb = tb, pg, nil
	}
	shared.refs++
	shared.dbs++
	pg, name := shared.pg, fmt.Sprintf("t%d_%s", shared.dbs, dbSafe(t.Name()))
	shared.mu.Unlock()
	t.Cleanup(releaseShared(t))
	if _, err := pg.Exec("", "CREATE DATABASE "+name); err != nil {
		t.Fatalf("database of the test: %v", err)
	}
	return &pgDB{Postgres: pg, name: name}
}

// releaseShared is t's cleanup that lets the shared server go; the last
// one stops it.
func releaseShared(t *testing.T) func() {
	return func() {
		shared.mu.Lock()
		defer shared.mu.Unlock()
		if shared.refs--; shared.refs > 0 {
			return
		}
		tb := shared.tb
		shared.tb, shared.pg, shared.pb = nil, nil, nil
		tb.stop()
		tb.report(t)
	}
}

// bouncerFor returns a PgBouncer in transaction pooling mode in front of
// d's server: the shared one (started once) if d is on the shared server,
// else one of t's own.
func bouncerFor(t *testing.T, d *pgDB) *bouncerDB {
	t.Helper()
	shared.mu.Lock()
	if d.Postgres != shared.pg {
		shared.mu.Unlock()
		return &bouncerDB{PgBouncer: testserver.StartPgBouncer(t, d.Postgres), name: d.name}
	}
	defer shared.mu.Unlock()
	if shared.pb == nil {
		tb, pg := shared.tb, shared.pg
		if !tb.run(func() { shared.pb = testserver.StartPgBouncer(tb, pg) }) {
			tb.report(t)
			t.FailNow()
		}
	}
	return &bouncerDB{PgBouncer: shared.pb, name: d.name}
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

// sharedTB is the testserver.TB that owns the shared servers: their
// cleanups run when the last test holding them ends (stop), and what goes
// wrong is reported to the test that started or stopped them.
type sharedTB struct {
	mu       sync.Mutex
	cleanups []func()
	errs     []string
	skipped  bool
}

func (s *sharedTB) Helper() {}

func (s *sharedTB) Errorf(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.errs = append(s.errs, fmt.Sprintf(format, args...))
}

// Fatal and Fatalf record the failure and end the goroutine of run.
func (s *sharedTB) Fatal(args ...any) {
	s.Errorf("%s", fmt.Sprint(args...))
	runtime.Goexit()
}

func (s *sharedTB) Fatalf(format string, args ...any) {
	s.Errorf(format, args...)
	runtime.Goexit()
}

// Skip (a server missing outside CI) records the reason and ends the
// goroutine of run; report skips the test.
func (s *sharedTB) Skip(args ...any) {
	s.mu.Lock()
	s.skipped = true
	s.mu.Unlock()
	s.Errorf("%s", fmt.Sprint(args...))
	runtime.Goexit()
}

func (s *sharedTB) Cleanup(f func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cleanups = append(s.cleanups, f)
}

func (s *sharedTB) TempDir() string {
	dir, err := os.MkdirTemp("", "dlock-pglock-shared-")
	if err != nil {
		s.Fatal(err)
	}
	s.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// run calls f on a goroutine of its own (Fatal ends it) and reports
// whether f returned.
func (s *sharedTB) run(f func()) bool {
	done, ok := make(chan struct{}), false
	go func() {
		defer close(done)
		f()
		ok = true
	}()
	<-done
	return ok
}

// stop runs the cleanups, last registered first.
func (s *sharedTB) stop() {
	s.mu.Lock()
	fs := s.cleanups
	s.cleanups = nil
	s.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		fs[i]()
	}
}

// report passes what went wrong on to t: a skip, or errors.
func (s *sharedTB) report(t *testing.T) {
	t.Helper()
	s.mu.Lock()
	errs, skipped := s.errs, s.skipped
	s.errs = nil
	s.mu.Unlock()
	switch {
	case skipped:
		t.Skip(strings.Join(errs, "; "))
	case len(errs) > 0:
		t.Errorf("shared PostgreSQL server: %s", strings.Join(errs, "; "))
	}
}
