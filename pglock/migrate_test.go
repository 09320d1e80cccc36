package pglock_test

import (
	"os"
	"strings"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/pglock"
)

// A lease table made by migration 1 (before shared and limited modes) is
// upgraded in place by the next Locker: its live lease is kept and still
// excludes, tokens continue above it, and migrating again changes
// nothing.
func TestMigrationUpgradesInPlace(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	m1, err := os.ReadFile("migrations/0001_leases.sql")
	if err != nil {
		t.Fatal(err)
	}
	sql := strings.NewReplacer("{{table}}", "old_leases", "{{sequence}}", "old_leases_token_seq").Replace(string(m1))
	setup := sql + `
CREATE TABLE ` + pglock.MigrationsTable + ` (component text NOT NULL, version int NOT NULL, applied_at timestamptz NOT NULL DEFAULT clock_timestamp(), PRIMARY KEY (component, version));
INSERT INTO ` + pglock.MigrationsTable + ` (component, version) VALUES ('leases:old_leases', 1);
INSERT INTO old_leases (key, owner, token, expires_at) VALUES ('held', 'oldowner', nextval('old_leases_token_seq'), clock_timestamp() + interval '1 hour');`
	if _, err := pg.Exec("", setup); err != nil {
		t.Fatal(err)
	}
	ctx := dlocktest.Context(t)
	pool := newPool(t, pg.DSN(""))
	l := pglock.New(pool, pglock.WithTable("old_leases"))
	_, err = l.TryAcquire(ctx, "held", dlock.WithShared())
	if na := notAcquired(t, err, "reader on the old table's live lease"); len(na.Holders) != 1 || na.Holders[0].Owner != "oldowner" {
		t.Fatalf("holders %+v, want the old lease's owner", na.Holders)
	}
	r, err := l.TryAcquire(ctx, "free", dlock.WithShared())
	if err != nil {
		t.Fatalf("reader on the upgraded table: %v", err)
	}
	if r.Token() <= 1 {
		t.Errorf("token %d not above the old lease's", r.Token())
	}
	mustRelease(t, r)
	if err := pglock.Migrate(ctx, pool, pglock.WithTable("old_leases")); err != nil {
		t.Fatalf("Migrate again: %v", err)
	}
	if v, err := pg.Exec("", "SELECT max(version) FROM "+pglock.MigrationsTable+" WHERE component = 'leases:old_leases'"); err != nil || v != "3" {
		t.Fatalf("recorded version %q, %v; want 3", v, err)
	}
}

// The least-privilege setup: the lease table made by an administrator
// (pglock.Migrate), the application's role allowed only to use it (and,
// as PostgreSQL 15's default, not to create in public). A default Locker
// (migration on first use) works for that role in every mode; without
// the table, the role is told to run pglock.Migrate.
// Symptom: every call failed with "permission denied for schema public", blamed on the lease table.
func TestMigrate_OnFirstUseNeedsOnlyTableGrants(t *testing.T) {
	t.Parallel()
	pg := ownPG(t)
	if err := pglock.Migrate(dlocktest.Context(t), newPool(t, pg.DSN(""))); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		"CREATE ROLE app LOGIN PASSWORD 'pw'",
		"REVOKE CREATE ON SCHEMA public FROM PUBLIC",
		"GRANT SELECT, INSERT, UPDATE ON " + pglock.DefaultTable + " TO app",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON " + pglock.DefaultTable + "_holders, " + pglock.DefaultTable + "_writers TO app",
		"GRANT USAGE ON SEQUENCE " + pglock.DefaultTable + "_token_seq TO app",
		"GRANT SELECT ON " + pglock.MigrationsTable + " TO app",
	} {
		if _, err := pg.Exec("", sql); err != nil {
			t.Fatal(err)
		}
	}
	app := strings.Replace(pg.DSN(""), testserver.PostgresUser+"@", "app:pw@", 1)
	l := pglock.New(newPool(t, app))
	key := dlocktest.Key(t)
	lk, err := l.Acquire(dlocktest.Context(t), key)
	if err != nil {
		t.Fatalf("Acquire as a role that may only use the lease table: %v", err)
	}
	if infos, err := l.List(dlocktest.Context(t), key); err != nil || len(infos) != 1 {
		t.Fatalf("List: %v %v", infos, err)
	}
	// Shared and limited holders and waiting writers use the holders and
	// writers tables: the same role, with the grants above.
	for _, opt := range []dlock.Option{dlock.WithShared(), dlock.WithLimit(2)} {
		r, err := l.Acquire(dlocktest.Context(t), key+"/m", opt)
		if err != nil {
			t.Fatalf("Acquire %v as the least-privilege role: %v", opt, err)
		}
		if err := r.Release(dlocktest.Context(t)); err != nil {
			t.Fatal(err)
		}
	}
	if err := lk.Release(dlocktest.Context(t)); err != nil {
		t.Fatal(err)
	}
	// Without the table, the same role is told to run Migrate as a role
	// that may create it.
	_, err = pglock.New(newPool(t, app), pglock.WithTable("other")).TryAcquire(dlocktest.Context(t), key)
	if err == nil || !strings.Contains(err.Error(), "pglock.Migrate") {
		t.Fatalf("no table and no privilege to create it: %v, want an error naming pglock.Migrate", err)
	}
	t.Logf("no table, no privilege: %v", err)
}
