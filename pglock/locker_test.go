package pglock_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/pglock"
)

// A nil pool, an invalid table name or a negative request timeout make
// every call fail with the documented sentinel; a missing table under
// WithoutMigrate is an error naming pglock.Migrate; a schema-qualified
// table works.
func TestBadInput(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	pool := newPool(t, pg.DSN(""))
	for name, tc := range map[string]struct {
		l    *pglock.Locker
		want error
	}{
		"nil pool":         {pglock.New(nil), dlock.ErrNilClient},
		"quoted table":     {pglock.New(pool, pglock.WithTable(`"x"`)), dlock.ErrInvalidOption},
		"injection":        {pglock.New(pool, pglock.WithTable("x; DROP TABLE y")), dlock.ErrInvalidOption},
		"upper case":       {pglock.New(pool, pglock.WithTable("Locks")), dlock.ErrInvalidOption},
		"three parts":      {pglock.New(pool, pglock.WithTable("a.b.c")), dlock.ErrInvalidOption},
		"empty table":      {pglock.New(pool, pglock.WithTable("")), dlock.ErrInvalidOption},
		"too long":         {pglock.New(pool, pglock.WithTable(strings.Repeat("a", 49))), dlock.ErrInvalidOption},
		"negative timeout": {pglock.New(pool, pglock.WithRequestTimeout(-time.Second)), dlock.ErrInvalidOption},
	} {
		if _, err := tc.l.TryAcquire(dlocktest.Context(t), "k"); !errors.Is(err, tc.want) {
			t.Errorf("%s: TryAcquire = %v, want %v", name, err, tc.want)
		}
		if _, err := tc.l.List(dlocktest.Context(t), ""); !errors.Is(err, tc.want) {
			t.Errorf("%s: List = %v, want %v", name, err, tc.want)
		}
	}
	if err := pglock.Migrate(context.Background(), nil); !errors.Is(err, dlock.ErrNilClient) {
		t.Errorf("Migrate(nil pool) = %v", err)
	}
	// WithoutMigrate and no table: a clear error naming Migrate.
	l := pglock.New(pool, pglock.WithTable("never_made"), pglock.WithoutMigrate())
	_, err := l.TryAcquire(dlocktest.Context(t), "k")
	if err == nil || !strings.Contains(err.Error(), "pglock.Migrate") {
		t.Fatalf("missing table: %v, want an error naming pglock.Migrate", err)
	}
	// A schema-qualified table is made by Migrate and used.
	if _, err := pg.Exec("", "CREATE SCHEMA app"); err != nil {
		t.Fatal(err)
	}
	if err := pglock.Migrate(dlocktest.Context(t), pool, pglock.WithTable("app.locks")); err != nil {
		t.Fatal(err)
	}
	lk, err := pglock.New(pool, pglock.WithTable("app.locks"), pglock.WithoutMigrate()).Acquire(dlocktest.Context(t), "k")
	if err != nil {
		t.Fatal(err)
	}
	lk.Release(context.Background())
}

// A read-only server (a hot standby, here default_transaction_read_only)
// is refused with an error saying why.
func TestReadOnly(t *testing.T) {
	t.Parallel()
	pg := ownPG(t)
	if _, err := pg.Exec("", "CREATE DATABASE ro"); err != nil {
		t.Fatal(err)
	}
	if err := pglock.Migrate(dlocktest.Context(t), newPool(t, pg.DSN("ro"))); err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Exec("", "ALTER DATABASE ro SET default_transaction_read_only = on"); err != nil {
		t.Fatal(err)
	}
	_, err := pglock.New(newPool(t, pg.DSN("ro"))).TryAcquire(dlocktest.Context(t), "k")
	if err == nil || !strings.Contains(err.Error(), "read-only") {
		t.Fatalf("TryAcquire on a read-only database: %v", err)
	}
}

// A wrong password is an error in bounded time, not a held key.
func TestWrongPassword(t *testing.T) {
	t.Parallel()
	pg := ownPG(t)
	if _, err := pg.Exec("", "CREATE ROLE app LOGIN PASSWORD 'right'"); err != nil {
		t.Fatal(err)
	}
	dsn := strings.Replace(pg.DSN(""), testserver.PostgresUser+"@", "app:wrong@", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := pglock.New(newPool(t, dsn)).TryAcquire(ctx, "k")
	if err == nil || errors.Is(err, dlock.ErrNotAcquired) || !strings.Contains(err.Error(), "password authentication failed") {
		t.Fatalf("TryAcquire with a wrong password: %v", err)
	}
	if strings.Contains(err.Error(), "wrong") {
		t.Fatalf("the error shows the password: %v", err)
	}
	t.Logf("wrong password: %v", err)
}

// Every call of a nil *Locker is an error wrapping dlock.ErrNilClient.
// Symptom: Acquire and TryAcquire of a nil *Locker panicked.
func TestNilLocker_EveryCallIsErrNilClient(t *testing.T) {
	dlocktest.TestNilLocker(t, (*pglock.Locker)(nil))
}

// Another backend's option is refused, not silently ignored.
// Symptom: etcdlock.New(c, zklock.WithPrefix("/app")) locked without the prefix.
func TestNew_RefusesAnotherBackendsOption(t *testing.T) {
	pg := sharedPG(t)
	dlocktest.TestRefusesForeignOption(t, pglock.New(newPool(t, pg.DSN("")), dlocktest.ForeignOption()))
}
