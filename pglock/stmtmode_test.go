package pglock_test

import (
	"context"
	"errors"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/pglock"
)

// A default pool that reaches PostgreSQL directly runs pglock's
// statements as prepared statements (pgx's statement cache) once its
// check has run: every call works, and the statements are in the
// connections' caches.
// Symptom: every statement was parsed and planned again, most of an uncontended acquire's time.
func TestStatementMode_DirectDefaultPool_PreparesStatements(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	pool := newPool(t, pg.DSN(""))
	l := pglock.New(pool)
	other := pglock.New(newPool(t, pg.DSN("")))
	ctx := dlocktest.Context(t)
	if m := pglock.CheckStatementMode(l); m != pgx.QueryExecModeCacheStatement {
		t.Fatalf("statement mode on a direct default pool: %v, want the statement cache", m)
	}
	key := dlocktest.Key(t)
	for i := 0; i < 3; i++ {
		lk, err := l.Acquire(ctx, key, dlock.WithMetadata("i", "x"))
		if err != nil {
			t.Fatalf("cycle %d: Acquire: %v", i, err)
		}
		if _, err := other.TryAcquire(ctx, key); !errors.Is(err, dlock.ErrNotAcquired) {
			t.Fatalf("cycle %d: another Locker's attempt on the held key: %v", i, err)
		}
		if err := lk.Refresh(ctx); err != nil {
			t.Fatalf("cycle %d: Refresh: %v", i, err)
		}
		if hs, err := l.List(ctx, key); err != nil || len(hs) != 1 {
			t.Fatalf("cycle %d: List: %v %v", i, hs, err)
		}
		if err := lk.Release(ctx); err != nil {
			t.Fatalf("cycle %d: Release: %v", i, err)
		}
	}
	prepared := 0
	for _, c := range pool.AcquireAllIdle(context.Background()) {
		var n int
		err := c.QueryRow(ctx, `SELECT count(*) FROM pg_prepared_statements WHERE strpos(statement, $1) > 0`,
			pgx.QueryExecModeSimpleProtocol, pglock.DefaultTable).Scan(&n)
		c.Release()
		if err != nil {
			t.Fatal(err)
		}
		prepared += n
	}
	if prepared == 0 {
		t.Fatal("no pglock statement is prepared on the pool's connections")
	}
	t.Logf("%d pglock statements prepared", prepared)
}

// A pool configured with a mode of its own keeps it, checked or not.
// Symptom: a pool set to the simple protocol got prepared statements.
func TestStatementMode_ConfiguredModeKept(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeSimpleProtocol, pgx.QueryExecModeExec, pgx.QueryExecModeCacheDescribe} {
		l := pglock.New(newPool(t, pg.DSN("")+"&default_query_exec_mode="+modeName(mode)))
		if m := pglock.CheckStatementMode(l); m != mode {
			t.Errorf("pool configured with %v: statements run in %v", mode, m)
		}
	}
}

func modeName(m pgx.QueryExecMode) string {
	return map[pgx.QueryExecMode]string{
		pgx.QueryExecModeSimpleProtocol: "simple_protocol",
		pgx.QueryExecModeExec:           "exec",
		pgx.QueryExecModeCacheDescribe:  "cache_describe",
	}[m]
}
