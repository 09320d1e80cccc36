package pglock_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/dlock-go/dlock/dlocktest"
	"github.com/dlock-go/dlock/internal/testserver"
	"github.com/dlock-go/dlock/pglock"
)

// A waiter behind PgBouncer in transaction mode does not LISTEN, and
// PgBouncer logs no notification for an unlinked server session. Direct
// and through a plain TCP proxy, LISTEN is kept.
// Symptom: the LISTEN stayed on a pooled server session; PgBouncer logged "got packet 'A' from server when not linked" for each NOTIFY and once exited with "server in bad state".
func TestNoListenThroughPooler(t *testing.T) {
	t.Parallel()
	pg := ownPG(t)
	bouncer := bouncerFor(t, pg)
	proxy := testserver.StartProxy(t, pg.Addr())
	for _, tc := range []struct {
		name   string
		dsn    string
		pooled bool
	}{
		{"direct", pg.DSN(""), false},
		{"tcp proxy", pg.ViaProxy(proxy.Addr()), false},
		{"pgbouncer", bouncer.DSN(""), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := dlocktest.Context(t)
			holder := pglock.New(newPool(t, tc.dsn))
			waiter := pglock.New(newPool(t, tc.dsn))
			key := dlocktest.Key(t)
			for round := 0; round < 5; round++ {
				lk, err := holder.Acquire(ctx, key)
				if err != nil {
					t.Fatal(err)
				}
				got := acquireLater(ctx, waiter, key, 20*time.Millisecond)
				time.Sleep(100 * time.Millisecond) // the waiter subscribes
				if err := lk.Release(ctx); err != nil {
					t.Fatal(err)
				}
				if err := <-got; err != nil {
					t.Fatalf("round %d: waiter: %v", round, err)
				}
			}
			if got := pglock.ListensThroughPooler(waiter); got != tc.pooled {
				t.Errorf("pooler detected = %v, want %v", got, tc.pooled)
			}
		})
	}
	log, _ := os.ReadFile(bouncer.LogPath())
	if n := strings.Count(string(log), "when not linked"); n > 0 {
		t.Errorf("pgbouncer logged %d notifications for server sessions no client was linked to", n)
	}
}

// Behind PgBouncer in transaction pooling mode with pgx's default
// configuration (its statement cache prepares named statements on the
// server connection, which the pooler hands to other clients), Migrate,
// Acquire, Refresh, List and Release all succeed, cycle after cycle:
// pglock runs its statements without the statement cache.
// Symptom: most calls failed with "prepared statement stmtcache_... already exists" (or "does not exist").
func TestPgBouncer_DefaultPgxPoolServesEveryCall(t *testing.T) {
	t.Parallel()
	pg := sharedPG(t)
	pb := bouncerFor(t, pg)
	dsn := strings.Replace(pb.DSN(""), "&default_query_exec_mode=exec", "", 1)
	if dsn == pb.DSN("") {
		t.Fatalf("cannot make a default DSN from %s", dsn)
	}
	const nPools = 4
	var lockers []*pglock.Locker
	for i := 0; i < nPools; i++ {
		p := newPool(t, dsn)
		if p.Config().ConnConfig.DefaultQueryExecMode != pgx.QueryExecModeCacheStatement {
			t.Fatalf("pool %d is not pgx's default configuration", i)
		}
		lockers = append(lockers, pglock.New(p))
		if m := pglock.CheckStatementMode(lockers[i]); m != pgx.QueryExecModeExec {
			t.Fatalf("pool %d through PgBouncer: statements run in %v, want the unnamed statement", i, m)
		}
		if err := pglock.Migrate(dlocktest.Context(t), p); err != nil {
			t.Fatalf("Migrate through PgBouncer with a default pool: %v", err)
		}
	}
	key := dlocktest.Key(t)
	var last uint64
	for i := 0; i < 40; i++ {
		l := lockers[i%nPools]
		lk, err := l.Acquire(dlocktest.Context(t), key)
		if err != nil {
			t.Fatalf("cycle %d: Acquire through PgBouncer with a default pool: %v", i, err)
		}
		if lk.Token() <= last {
			t.Fatalf("cycle %d: token %d after %d", i, lk.Token(), last)
		}
		last = lk.Token()
		if err := lk.Refresh(dlocktest.Context(t)); err != nil {
			t.Fatalf("cycle %d: Refresh: %v", i, err)
		}
		if _, err := lockers[(i+1)%nPools].List(dlocktest.Context(t), key); err != nil {
			t.Fatalf("cycle %d: List: %v", i, err)
		}
		if err := lk.Release(dlocktest.Context(t)); err != nil {
			t.Fatalf("cycle %d: Release: %v", i, err)
		}
	}
}

// A role that may not run pg_backend_pid() (revoked from PUBLIC in a
// hardened database): a server that answers the pooler check with an
// error is taken as "cannot tell": the Locker stops trying LISTEN and its
// waiters poll, still acquiring the key once it is released.
// Symptom: while anyone waited, the Locker opened and closed a server connection a second, never listening.
func TestPooler_CheckRefusedStopsListenWaitersPoll(t *testing.T) {
	t.Parallel()
	pg := ownPG(t)
	if err := pglock.Migrate(dlocktest.Context(t), newPool(t, pg.DSN(""))); err != nil {
		t.Fatal(err)
	}
	for _, sql := range []string{
		"CREATE ROLE app LOGIN PASSWORD 'pw'",
		"GRANT SELECT, INSERT, UPDATE ON " + pglock.DefaultTable + " TO app",
		"GRANT SELECT, INSERT, UPDATE, DELETE ON " + pglock.DefaultTable + "_holders, " + pglock.DefaultTable + "_writers TO app",
		"GRANT USAGE ON SEQUENCE " + pglock.DefaultTable + "_token_seq TO app",
		"GRANT SELECT ON " + pglock.MigrationsTable + " TO app",
		"REVOKE EXECUTE ON FUNCTION pg_backend_pid() FROM PUBLIC",
	} {
		if _, err := pg.Exec("", sql); err != nil {
			t.Fatal(err)
		}
	}
	app := strings.Replace(pg.DSN(""), testserver.PostgresUser+"@", "app:pw@", 1)
	key := dlocktest.Key(t)
	ctx := dlocktest.Context(t)
	holder := pglock.New(newPool(t, pg.DSN("")))
	waiter := pglock.New(newPool(t, app))
	hl, err := holder.Acquire(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	got := acquireLater(ctx, waiter, key, 20*time.Millisecond)
	end := time.Now().Add(dlocktest.HangTimeout)
	for pglock.ListenGivenUp(waiter) == nil {
		if time.Now().After(end) {
			t.Fatal("the Locker still tries to LISTEN (a new server connection a second) though the server refuses the pooler check")
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("given up: %v", pglock.ListenGivenUp(waiter))
	if m := pglock.CheckStatementMode(waiter); m != pgx.QueryExecModeExec {
		t.Errorf("the server refused the pooler check, yet statements run in %v", m)
	}
	if pglock.ListensThroughPooler(waiter) {
		t.Error("reported as a pooler")
	}
	if err := hl.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-got; err != nil {
		t.Fatal(err)
	}
}
